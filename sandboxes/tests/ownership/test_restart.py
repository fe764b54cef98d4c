"""Restart safety on Kubernetes: SIGKILL the service mid-create and mid-delete, start again.

The first controller runs in a process of its own (``controller_proc.py``) against the
stand-in cluster, which runs in the test process and holds one create (stored, not yet
answered) and one delete (received, not applied) at gates. The test then SIGKILLs that
process -- no cleanup of any kind runs -- and starts a new controller over the same
database and stand-in. Reconcile must adopt the live sandboxes (an in-use one still runs
commands, a warm one is handed out again), delete the pod of the killed create, resume
the killed delete from its ``PendingDelete`` row, and the periodic sweep must delete a
labelled pod no record owns. After the drain the store holds no Sandman pod.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from sandboxes import labels as L
from sandboxes.controller import Controller
from sandboxes.models import Job, PendingDelete, Sandbox
from sandboxes.tests.controller_support import IMAGE, SPEC, acquire_args, execd, make_job
from standin import StandinCluster
from standin.harness.support import (
    NS,
    SENTINEL,
    audit,
    k8s_provider,
    other_pods,
    other_tenant_pod,
    pod_container,
    sandman_pods,
    wait_until,
)

REPO = Path(__file__).resolve().parents[3]


class ControllerProcess:
    """The service in a child process: commands over stdin, answers over stdout."""

    def __init__(self, cluster: StandinCluster) -> None:
        self._stderr = tempfile.TemporaryFile()
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "sandman_site.settings.test",
            "SANDMAN_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
            "SANDMAN_TEST_K8S_URL": cluster.url,
            "SANDMAN_TEST_NAMESPACE": NS,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sandboxes.tests.ownership.controller_proc"],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._answers: dict[int, Future[dict[str, Any]]] = {}
        self._ready: queue.Queue[bool] = queue.Queue()
        self._next = 0
        self._reader = threading.Thread(target=self._read, name="controller-proc-reader")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            message = json.loads(line)
            if message.get("ready"):
                self._ready.put(True)
            elif message.get("id") in self._answers:
                self._answers[message["id"]].set_result(message)
        self._ready.put(False)

    def wait_ready(self, timeout: float = 120.0) -> None:
        if not self._ready.get(timeout=timeout):
            raise AssertionError(f"the controller process died: {self.stderr()}")

    def call(self, op: str, **fields: Any) -> Future[dict[str, Any]]:
        self._next += 1
        future: Future[dict[str, Any]] = Future()
        self._answers[self._next] = future
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": self._next, "op": op, **fields}) + "\n")
        self.proc.stdin.flush()
        return future

    def result(self, op: str, **fields: Any) -> Any:
        answer = self.call(op, **fields).result(timeout=120)
        assert answer["ok"], answer
        return answer["result"]

    def kill(self) -> None:
        """SIGKILL: the service dies with whatever it was doing."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(timeout=30)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()

    def stderr(self) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-4000:]


class Env:
    def __init__(self) -> None:
        self.cluster = StandinCluster(nodes=2, run_execd=True)
        self.processes: list[ControllerProcess] = []
        self.controllers: list[Controller] = []
        self.sentinel_uid = ""

    def start(self) -> Env:
        self.cluster.start()
        self.sentinel_uid = self.cluster.put_pod(NS, other_tenant_pod(SENTINEL))["metadata"]["uid"]
        return self

    def process(self) -> ControllerProcess:
        proc = ControllerProcess(self.cluster)
        self.processes.append(proc)
        proc.wait_ready()
        return proc

    def controller(self, **kw: Any) -> Controller:
        controller = Controller(provider=k8s_provider(self.cluster), **kw)
        self.controllers.append(controller)
        controller.start()
        return controller

    def stop(self) -> None:
        try:
            for proc in self.processes:
                proc.kill()
            for controller in self.controllers:
                controller.stop()
        finally:
            self.cluster.gates.release_all()
            self.cluster.run_until_idle(timeout=60)
            self.cluster.stop()


@pytest.fixture
def env(transactional_db: None) -> Iterator[Env]:
    e = Env().start()
    try:
        yield e
    finally:
        e.stop()


def test_a_service_killed_mid_create_and_mid_delete_leaks_nothing_after_the_next_start(env):
    job = make_job(egress="deny")
    prefix = f"sm-{job.pk}-"
    first = env.process()
    kept = first.result("acquire", args=acquire_args(job))  # in use: adopted later
    doomed = first.result("acquire", args=acquire_args(job))  # its delete is killed
    create_held = env.cluster.gates.add("create_stored", name_prefix=prefix)
    first.call("acquire", args=acquire_args(job))  # its create is killed
    killed_create = create_held.wait_reached(60).name
    key = {"image": IMAGE, "base_commit": None, **SPEC}
    first.result("prewarm", job_id=job.pk, count=1, key=key)  # warm: adopted later
    warm = wait_until(
        lambda: Sandbox.objects.filter(job=job, state="ready").first(), what="a warm pod"
    )
    delete_held = env.cluster.gates.add("delete_received", name=doomed["name"])
    first.result("release", sandbox_id=doomed["sandbox_id"])
    delete_held.wait_reached(60)
    first.kill()  # mid-create and mid-delete

    names = {p["metadata"]["name"] for p in sandman_pods(env.cluster)}
    assert names == {kept["name"], doomed["name"], warm.name, killed_create}
    report = audit(env.cluster, None, at="after SIGKILL")  # the database is all that is left
    assert report.ownerless == []
    assert Sandbox.objects.get(name=killed_create).state == "creating"
    assert PendingDelete.objects.filter(name=doomed["name"]).exists()

    second = env.controller(sweep_interval_s=0.2, maintenance_interval_s=None)
    assert Sandbox.objects.get(name=killed_create).state == "deleted"
    assert Sandbox.objects.get(name=doomed["name"]).state == "deleted"
    assert PendingDelete.objects.count() == 0
    left = {p["metadata"]["name"] for p in sandman_pods(env.cluster)}
    assert left == {kept["name"], warm.name}
    ran = execd(kept["address"], kept["token"], "/exec", {"command": "echo adopted"})
    assert ran["output"].strip() == "adopted"
    again = second.acquire(**acquire_args(job))
    assert (again.source, again.sandbox_id) == ("warm", warm.pk)

    stray = f"sm-{job.pk}-{'0' * 12}"  # Sandman's labels, a name no record knows
    env.cluster.put_pod(
        NS,
        {
            "metadata": {
                "name": stray,
                "labels": {L.MANAGED_BY: L.VALUE_MANAGED_BY, L.JOB: str(job.pk)},
                "annotations": {L.NONCE_ANNOTATION: "not-ours"},
            },
            "spec": {"containers": [pod_container(IMAGE)]},
        },
    )
    wait_until(lambda: env.cluster.pod(NS, stray) is None, what="the periodic sweep")
    deletes = [r for r in env.cluster.requests_log() if r["verb"] == "delete"]
    assert [r["name"] for r in deletes].count(stray) == 1  # nothing but the sweep knew it

    create_held.release()  # the killed process's calls finish, answered to nobody
    delete_held.release()
    second.drain(job_id=job.pk)
    wait_until(lambda: Job.objects.get(pk=job.pk).state == "drained", what="the drain")
    assert sandman_pods(env.cluster) == []
    assert other_pods(env.cluster) == {SENTINEL: env.sentinel_uid}
    assert f"sandman-job-{job.pk}" not in {
        c["metadata"]["name"] for c in env.cluster.configmaps(NS)
    }
