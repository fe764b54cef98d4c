"""Split processes: ``manage.py run_controller`` plus two uvicorn web workers, one database.

Real processes (architecture §3.1, README's production command): the controller process
listens on ``SANDMAN_CONTROLLER_SOCKET``; ``uvicorn --workers 2`` runs the ASGI app in two
worker processes that start no controller and send every acquire, release, prewarm and
drain to it. The backend is Kubernetes against the stand-in API server (in this process,
over HTTP, each pod a real execd), leader election off. The test drives the service over REST only.

* A burst of concurrent acquires on fresh connections (spread over both workers by the
  kernel) hands out distinct warm sandboxes, each with one ``ok`` acquisition naming it.
* Their releases are deleted: every row ends ``deleted``, no pending delete is left and the
  cluster keeps no pod of them.
* SIGKILLing every web worker while acquires wait for creates the stand-in holds loses
  nothing: the controller sees the workers' connections close and cancels those waits (the
  rows end ``cancelled``, none ``pending``); the creates go on and their pods end warm, not
  in use (an unused pod is kept: Table 2, row 1); uvicorn's supervisor starts new workers
  and the next acquires get those pods. A held create is the stand-in holding the
  API server's answer after the pod is stored (a slow create, as an admission webhook or a
  loaded API server makes one: https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/).
* SIGTERM to the controller process (what the kubelet sends first at a pod's deletion:
  https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination)
  while an acquire waits on a held create: the workers' ``/readyz`` turns 503 and new
  acquires get ``503 controller_unavailable`` with ``Retry-After``, while the waiting
  acquire is drained: it gets its sandbox once the create lands, and only then does the
  process exit (0).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from sandboxes.models import Acquisition, PendingDelete, Sandbox
from sandman_site.testing.replicas import Api, SplitService, status_of
from standin import StandinCluster
from standin.harness.support import NS, audit, sandman_pods, wait_until
from standin.kubeconfig import write_kubeconfig

IMAGE = "registry.example/task/swe-task:1"
SPEC = {"cpu": "250m", "memory": "256Mi"}
COLD_SPEC = {"cpu": "250m", "memory": "512Mi"}  # a key with no warm pod: acquires create
WARM = 12

pytestmark = pytest.mark.skipif(
    not os.environ.get("DATABASE_URL"), reason="the processes share one PostgreSQL"
)


def burst(api: Api, service: Any, calls: list[tuple[str, str, Any]]) -> list[Any]:
    """The calls at once, from threads (a connection each); answers or transport errors."""
    outcomes: list[Any] = [None] * len(calls)

    def one(i: int) -> None:
        method, path, body = calls[i]
        try:
            outcomes[i] = api.call(service, method, path, body)
        except OSError as broken:  # the worker was killed under it
            outcomes[i] = ("broken", type(broken).__name__)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads), "a call hangs"
    return outcomes


@pytest.fixture
def rig(transactional_db: None) -> Iterator[dict[str, Any]]:
    cluster = StandinCluster(nodes=2, run_execd=True)  # a warm hand-out checks execd first
    cluster.start()
    tmp = Path(tempfile.mkdtemp(prefix="sandman-split-"))
    kubeconfig = write_kubeconfig(tmp / "kubeconfig", cluster.url, namespace=NS)
    env = {
        "SANDMAN_BACKEND": "kubernetes",
        "KUBECONFIG": str(kubeconfig),
        "SANDMAN_NAMESPACE": NS,
        "SANDMAN_LEADER_ELECTION": "false",
    }
    service = SplitService(env, tmp, workers=2)
    try:
        yield {"cluster": cluster, "service": service}
    finally:
        service.stop()
        cluster.gates.release_all()
        cluster.stop()


def test_split_processes_hand_out_each_sandbox_once_delete_releases_and_survive_killed_workers(
    rig,
):
    cluster: StandinCluster = rig["cluster"]
    service: SplitService = rig["service"]
    wait_until(lambda: status_of(service, "/healthz") == 200, what="the web workers")
    assert len(service.workers()) == 2
    user = get_user_model().objects.create_user(username="trainer")
    api = Api(Token.objects.create(user=user).key)
    status, job = api.call(
        service,
        "POST",
        "/api/v1/jobs/",
        {
            "name": "split",
            "egress": "allow",
            "pacing": {"rate_per_s": 100, "burst": 100},
            "warm": {"per_key": 0},
        },
    )
    assert status == 201, job
    jid = job["id"]
    prewarm = {"keys": [{"image": IMAGE, "spec": SPEC, "count": WARM}]}
    assert api.call(service, "POST", f"/api/v1/jobs/{jid}/prewarm/", prewarm)[0] == 202
    wait_until(
        lambda: Sandbox.objects.filter(job_id=jid, state="ready").count() == WARM,
        what="the warm pool",
    )

    # Hand-outs: each warm sandbox once.
    acquire = {"image": IMAGE, "spec": SPEC, "timeout_s": 60}
    path = f"/api/v1/jobs/{jid}/acquire/"
    answers = burst(api, service, [("POST", path, acquire)] * WARM)
    assert [a[0] for a in answers] == [200] * WARM, answers
    ids = [a[1]["sandbox_id"] for a in answers]
    assert len(set(ids)) == WARM and {a[1]["source"] for a in answers} == {"warm"}
    assert set(Sandbox.objects.filter(job_id=jid, state="in_use").values_list("pk", flat=True)) == (
        set(ids)
    )
    ok = Acquisition.objects.filter(job_id=jid, outcome="ok")
    assert sorted(ok.values_list("sandbox_id", flat=True)) == sorted(ids)

    # Releases are deleted.
    releases = [("POST", f"/api/v1/sandboxes/{i}/release/", {}) for i in ids]
    assert [r[0] for r in burst(api, service, releases)] == [200] * WARM
    wait_until(
        lambda: (
            Sandbox.objects.filter(pk__in=ids, state="deleted").count() == WARM
            and not PendingDelete.objects.exists()
        ),
        what="the released sandboxes to be deleted",
    )
    names = set(Sandbox.objects.filter(pk__in=ids).values_list("name", flat=True))
    assert not names & {p["metadata"]["name"] for p in sandman_pods(cluster)}

    # Killed web workers: acquires waiting on held creates are cancelled, nothing is lost.
    gates = [cluster.gates.add("create_stored", name_prefix=f"sm-{jid}-") for _ in range(3)]
    outcomes: list[Any] = []
    cold = {"image": IMAGE, "spec": COLD_SPEC, "timeout_s": 60}
    waiting = threading.Thread(
        target=lambda: outcomes.extend(burst(api, service, [("POST", path, cold)] * 3))
    )
    waiting.start()
    held = [gate.wait_reached(60).name for gate in gates]
    wait_until(
        lambda: Acquisition.objects.filter(job_id=jid, outcome="pending").count() == 3,
        what="three acquires in flight",
    )
    killed = service.kill_workers()
    waiting.join(120)
    assert [o[0] for o in outcomes] == ["broken"] * 3, outcomes
    wait_until(
        lambda: not Acquisition.objects.filter(job_id=jid, outcome="pending").exists(),
        what="the cut acquires to be finished",
    )
    assert Acquisition.objects.filter(job_id=jid, outcome="cancelled").count() == 3
    cluster.gates.release_all()
    wait_until(
        lambda: Sandbox.objects.filter(name__in=held, state="ready").count() == 3,
        what="the held creates to settle warm",
    )
    assert not Sandbox.objects.filter(job_id=jid, state="in_use").exists()
    wait_until(
        lambda: (
            len(set(service.workers()) - set(killed)) == 2 and status_of(service, "/healthz") == 200
        ),
        what="uvicorn's supervisor to start new workers",
    )
    again = burst(api, service, [("POST", path, cold)] * 3)
    assert [a[0] for a in again] == [200] * 3, again
    assert sorted(a[1]["name"] for a in again) == sorted(held)
    assert {a[1]["source"] for a in again} == {"warm"}

    assert api.call(service, "POST", f"/api/v1/jobs/{jid}/drain/")[0] == 202
    wait_until(lambda: sandman_pods(cluster) == [], what="the drain", deadline_s=90)
    assert audit(cluster, None, at="after the drain").ownerless == []
    assert service.controller.poll() is None, service.output()


def test_a_sigtermed_controller_process_drains_the_acquire_in_flight_and_refuses_new_ones(rig):
    cluster: StandinCluster = rig["cluster"]
    service: SplitService = rig["service"]
    wait_until(lambda: status_of(service, "/readyz") == 200, what="the workers to be ready")
    user = get_user_model().objects.create_user(username="trainer")
    token = Token.objects.create(user=user).key
    api = Api(token)
    status, job = api.call(
        service,
        "POST",
        "/api/v1/jobs/",
        {"name": "drain", "egress": "allow", "warm": {"per_key": 0}},
    )
    assert status == 201, job
    path = f"/api/v1/jobs/{job['id']}/acquire/"
    gate = cluster.gates.add("create_stored", name_prefix=f"sm-{job['id']}-")
    outcome: list[Any] = []
    cold = {"image": IMAGE, "spec": COLD_SPEC, "timeout_s": 60}
    waiting = threading.Thread(target=lambda: outcome.append(api.call(service, "POST", path, cold)))
    waiting.start()
    held = gate.wait_reached(60).name
    service.controller.send_signal(signal.SIGTERM)
    wait_until(lambda: status_of(service, "/readyz") == 503, what="readiness to follow the stop")

    request = urllib.request.Request(
        service.url + path,
        data=json.dumps(cold).encode(),
        method="POST",
        headers={**api.headers, "Idempotency-Key": "after-the-sigterm"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 503 and refused.value.headers["Retry-After"] == "1"
    assert json.loads(refused.value.read())["error"] == "controller_unavailable"
    assert waiting.is_alive() and service.controller.poll() is None  # still draining

    cluster.gates.release_all()  # the create lands: the drained acquire gets its sandbox
    waiting.join(120)
    assert outcome and outcome[0][0] == 200, outcome
    assert outcome[0][1]["name"] == held and outcome[0][1]["source"] == "created"
    assert service.controller.wait(timeout=120) == 0, service.output()
    assert service.controller.stdout is not None
    assert b"1 calls drained, 0 cut" in service.controller.stdout.read()
    row = Acquisition.objects.get(job_id=job["id"], outcome="ok")
    assert row.sandbox_id == outcome[0][1]["sandbox_id"]
