"""Two replicas of the service on one PostgreSQL: the leader is SIGKILLed mid-burst.

Real processes: each replica is ``daphne sandman_site.asgi:application`` with the
production settings, the Kubernetes backend and leader election on a short Lease (3 s,
renew deadline 2 s, retry 1 s), against the stand-in API server (in this process, over
HTTP). The test drives them over REST only. The leader labels its own pod
``sandman.dev/leader=true`` (the trainers' Service selects it); a restarted leader comes
back as a standby and clears its label.

Before the kill the leader has a sandbox in use, a released one whose DELETE the stand-in
holds (its ``PendingDelete`` row is stored), a create the stand-in stored but has not
answered (its row is ``creating``) and more acquires waiting in the job's bucket (rows
``requested``). After the SIGKILL every acquire that was in flight ends -- an answer or a
broken connection, none hangs -- and the standby takes the Lease once its duration has
passed (Leases: https://kubernetes.io/docs/concepts/architecture/leases/; client-go
leader election: https://pkg.go.dev/k8s.io/client-go/tools/leaderelection). Its
controller reconciles from the database and the cluster: the in-use sandbox is adopted
(released on the new leader), the held delete is resumed from its row, the killed create's
pod is deleted, and new acquires succeed. No pod is ever without an owner, and after the
drain the cluster holds no Sandman pod. The standby, before, served reads, answered an
acquire ``503 controller_unavailable`` and ``/readyz`` 503 ``not_leader``.

An orderly stop (SIGTERM, what the kubelet sends a pod it deletes:
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination) releases
the Lease as client-go's ``ReleaseOnCancel`` does, after the leader's controller stopped,
and the standby leads at its next retry rather than after the Lease duration. Trainers use
the client (``sandboxes/client.py``) through a Service that selects the leader label
(``sandman_site/testing/service.py``), or at the standby directly: each keyed acquire
started during the failover ends with exactly one sandbox.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from sandboxes import labels as L
from sandboxes.client import Client
from sandboxes.client import Sandbox as ClientSandbox
from sandboxes.models import Acquisition, Job, PendingDelete, Sandbox, SandboxEvent
from sandman_site.testing.replicas import Api, Replica, status_of
from sandman_site.testing.service import LabelService
from standin import StandinCluster
from standin.harness.support import NS, audit, other_tenant_pod, sandman_pods, wait_until
from standin.kubeconfig import write_kubeconfig

IMAGE = "registry.example/task/swe-task:1"
ACQUIRE = {"image": IMAGE, "spec": {"cpu": "250m", "memory": "256Mi"}, "timeout_s": 60}
LEASE = {"SANDMAN_LEASE_DURATION_S": "3", "SANDMAN_LEASE_RENEW_DEADLINE_S": "2"}
# Longer than the test: a standby that leads did not wait for the Lease to expire.
LONG_LEASE = {"SANDMAN_LEASE_DURATION_S": "60", "SANDMAN_LEASE_RENEW_DEADLINE_S": "10"}
LEASE_NAME = "sandman-controller"
SERVICE_NS = "sandman"  # the replicas' own pods and the Lease; sandboxes live in NS

pytestmark = pytest.mark.skipif(
    not os.environ.get("DATABASE_URL"), reason="replicas share one PostgreSQL (DATABASE_URL)"
)


class Burst:
    """Acquires sent at once from threads; each records its answer or its transport error."""

    def __init__(self, api: Api, replica: Replica, job_id: int, n: int) -> None:
        self.outcomes: list[Any] = [None] * n
        self.threads = [
            threading.Thread(target=self._one, args=(api, replica, job_id, i), name=f"acq-{i}")
            for i in range(n)
        ]
        for thread in self.threads:
            thread.start()

    def _one(self, api: Api, replica: Replica, job_id: int, i: int) -> None:
        try:
            self.outcomes[i] = api.call(replica, "POST", f"/api/v1/jobs/{job_id}/acquire/", ACQUIRE)
        except OSError as broken:  # reset, refused, remote closed: a clear failure
            self.outcomes[i] = ("broken", type(broken).__name__)

    def join(self, timeout_s: float) -> list[Any]:
        end = time.monotonic() + timeout_s
        for thread in self.threads:
            thread.join(max(0.0, end - time.monotonic()))
        assert not any(t.is_alive() for t in self.threads), "an in-flight acquire hangs"
        return self.outcomes


@pytest.fixture
def rig(transactional_db: None) -> Iterator[dict[str, Any]]:
    cluster = StandinCluster(nodes=2)
    cluster.start()
    tmp = Path(tempfile.mkdtemp(prefix="sandman-failover-"))
    kubeconfig = write_kubeconfig(tmp / "kubeconfig", cluster.url, namespace=NS)
    replicas: list[Replica] = []
    rig: dict[str, Any] = {
        "cluster": cluster,
        "replicas": replicas,
        "kubeconfig": kubeconfig,
        "tmp": tmp,
    }
    try:
        yield rig  # a test may add "cleanup", run before the replicas stop
    finally:
        if "cleanup" in rig:
            rig["cleanup"]()
        for replica in replicas:
            replica.stop()
        cluster.gates.release_all()
        cluster.stop()


def replica_env(identity: str, kubeconfig: Path) -> dict[str, str]:
    return {
        **LEASE,
        "SANDMAN_BACKEND": "kubernetes",
        "KUBECONFIG": str(kubeconfig),
        "SANDMAN_NAMESPACE": NS,
        "SANDMAN_K8S_VERIFY_HEALTH": "false",
        "SANDMAN_LEASE_RETRY_PERIOD_S": "1",
        "SANDMAN_REPLICA_ID": identity,
        "SANDMAN_LEASE_NAMESPACE": SERVICE_NS,
        "SANDMAN_POD_NAMESPACE": SERVICE_NS,
        "SANDMAN_SWEEP_INTERVAL_S": "1",
    }


def history(job_id: int) -> str:
    """The job's acquisitions and each sandbox's events, for an assertion's message."""
    lines = [
        f"acquisition {a['id']}: {a['outcome']} sandbox={a['sandbox_id']}"
        f" key={a['idempotency_key'][:12]} {a['detail']}"
        for a in Acquisition.objects.filter(job_id=job_id)
        .order_by("pk")
        .values("id", "outcome", "sandbox_id", "idempotency_key", "detail")
    ]
    for sandbox in Sandbox.objects.filter(job_id=job_id).order_by("pk"):
        kinds = SandboxEvent.objects.filter(sandbox=sandbox).order_by("pk")
        lines.append(
            f"sandbox {sandbox.pk} {sandbox.state}: "
            + ", ".join(f"{e.kind}{e.detail or ''}" for e in kinds)
        )
    return "\n".join(lines)


def leader_label(cluster: StandinCluster, pod: str) -> str | None:
    return (cluster.pod(SERVICE_NS, pod) or {})["metadata"].get("labels", {}).get(L.LEADER)


def lease_holder(cluster: StandinCluster) -> str:
    return str(cluster.lease(SERVICE_NS, "sandman-controller")["spec"]["holderIdentity"])


def test_the_standby_takes_over_a_sigkilled_leader_mid_burst_and_nothing_leaks_or_hangs(rig):
    cluster: StandinCluster = rig["cluster"]
    for name in ("replica-a", "replica-b"):  # the replicas' own pods (the leader labels its)
        cluster.put_pod(SERVICE_NS, other_tenant_pod(name, labels={"app": "sandman"}))

    a, b = (
        Replica(i, replica_env(i, rig["kubeconfig"]), rig["tmp"])
        for i in ("replica-a", "replica-b")
    )
    rig["replicas"] += [a, b]  # started together; whichever takes the Lease first leads
    a, b = wait_until(
        lambda: (a, b) if status_of(a, "/readyz") == 200 else
        (b, a) if status_of(b, "/readyz") == 200 else None,
        what="a replica to lead",
        deadline_s=120,
    )  # fmt: skip
    wait_until(lambda: status_of(b, "/healthz") == 200, what="the standby to serve")
    assert lease_holder(cluster) == a.identity
    assert (leader_label(cluster, a.identity), leader_label(cluster, b.identity)) == ("true", None)

    user = get_user_model().objects.create_user(username="trainer")
    api = Api(Token.objects.create(user=user).key)
    status, job = api.call(
        a,
        "POST",
        "/api/v1/jobs/",
        {"name": "ha", "egress": "allow", "pacing": {"rate_per_s": 1, "burst": 1}},
    )
    assert status == 201, job
    # The standby serves reads, refuses acquires clearly and is not ready.
    assert api.call(b, "GET", f"/api/v1/jobs/{job['id']}/")[0] == 200
    status, refused = api.call(b, "POST", f"/api/v1/jobs/{job['id']}/acquire/", ACQUIRE)
    assert (status, refused["error"]) == (503, "controller_unavailable"), refused
    assert status_of(b, "/readyz") == 503

    status, kept = api.call(a, "POST", f"/api/v1/jobs/{job['id']}/acquire/", ACQUIRE)
    assert status == 200, kept
    status, doomed = api.call(a, "POST", f"/api/v1/jobs/{job['id']}/acquire/", ACQUIRE)
    assert status == 200, doomed
    delete_held = cluster.gates.add("delete_received", name=doomed["name"])
    assert api.call(a, "POST", f"/api/v1/sandboxes/{doomed['sandbox_id']}/release/", {})[0] == 200
    delete_held.wait_reached(60)
    create_held = cluster.gates.add("create_stored", name_prefix=f"sm-{job['id']}-")
    burst = Burst(api, a, job["id"], 6)
    killed_create = create_held.wait_reached(60).name
    wait_until(
        lambda: Sandbox.objects.filter(job_id=job["id"], state="requested").count() >= 3,
        what="acquires waiting in the job's bucket",
    )
    assert PendingDelete.objects.filter(name=doomed["name"]).exists()

    a.kill()  # SIGKILL mid-burst: no cleanup of any kind runs
    killed_at = time.monotonic()
    outcomes = burst.join(30)  # none hangs
    assert all(o is not None for o in outcomes)
    for outcome in outcomes:  # each one ended: a sandbox, or a clear failure
        assert outcome[0] == "broken" or outcome[0] in (200, 503, 504), outcome
    assert audit(cluster, None, at="after SIGKILL").ownerless == []
    cluster.gates.release_all()

    wait_until(lambda: status_of(b, "/readyz") == 200, what="the standby to take the Lease")
    takeover_s = time.monotonic() - killed_at
    assert lease_holder(cluster) == b.identity and leader_label(cluster, b.identity) == "true"
    print(f"takeover after SIGKILL: {takeover_s:.2f} s (lease 3 s, retry 1 s)")
    # The killed leader's container restarts (same pod, same identity): a standby.
    restarted = Replica(
        a.identity, replica_env(a.identity, rig["kubeconfig"]), rig["tmp"], log_name="restarted"
    )
    rig["replicas"].append(restarted)

    # Reconciled from the database and the cluster before /readyz turned 200.
    assert Sandbox.objects.get(name=killed_create).state == "deleted"
    assert not Sandbox.objects.filter(job_id=job["id"], state__in=["requested", "creating"])
    wait_until(lambda: not PendingDelete.objects.exists(), what="the held delete to resume")
    assert Sandbox.objects.get(name=doomed["name"]).state == "deleted"
    assert Sandbox.objects.get(pk=kept["sandbox_id"]).state == "in_use"  # adopted
    assert api.call(b, "POST", f"/api/v1/sandboxes/{kept['sandbox_id']}/release/", {})[0] == 200
    again = Burst(api, b, job["id"], 3).join(60)
    assert [o[0] for o in again] == [200, 200, 200], again
    assert audit(cluster, None, at="after the takeover").ownerless == []

    wait_until(lambda: status_of(restarted, "/healthz") == 200, what="the restarted replica")
    assert status_of(restarted, "/readyz") == 503 and leader_label(cluster, a.identity) is None
    assert lease_holder(cluster) == b.identity

    assert api.call(b, "POST", f"/api/v1/jobs/{job['id']}/drain/")[0] == 202
    wait_until(
        lambda: Job.objects.get(pk=job["id"]).state == "drained", what="the drain", deadline_s=90
    )
    assert sandman_pods(cluster) == []
    assert b.proc.poll() is None, b.output()


class Trainer:
    """One keyed acquire through the trainer client, in a thread: a sandbox or the error."""

    def __init__(self, client: Client, job_id: int) -> None:
        self.client, self.job_id = client, job_id
        self.outcome: Any = None
        self.thread = threading.Thread(target=self._run, name="trainer")
        self.thread.start()

    def _run(self) -> None:
        try:
            job = self.client.get_job(self.job_id)
            self.outcome = job.acquire(image=IMAGE, spec=ACQUIRE["spec"], timeout_s=60)
        except Exception as exc:  # recorded: the test asserts what it was
            self.outcome = exc

    def join(self, timeout_s: float) -> Any:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "an acquire started during the failover hangs"
        return self.outcome


def test_a_sigtermed_leader_releases_the_lease_after_its_controller_stopped_and_the_standby_leads_at_once(  # noqa: E501
    rig,
):
    cluster: StandinCluster = rig["cluster"]
    for name in ("replica-a", "replica-b"):
        cluster.put_pod(SERVICE_NS, other_tenant_pod(name, labels={"app": "sandman"}))
    a, b = (
        Replica(i, {**replica_env(i, rig["kubeconfig"]), **LONG_LEASE}, rig["tmp"])
        for i in ("replica-a", "replica-b")
    )
    rig["replicas"] += [a, b]
    a, b = wait_until(
        lambda: (a, b) if status_of(a, "/readyz") == 200 else
        (b, a) if status_of(b, "/readyz") == 200 else None,
        what="a replica to lead",
        deadline_s=120,
    )  # fmt: skip
    wait_until(lambda: status_of(b, "/healthz") == 200, what="the standby to serve")
    user = get_user_model().objects.create_user(username="trainer")
    token = Token.objects.create(user=user).key
    api = Api(token)
    status, job = api.call(a, "POST", "/api/v1/jobs/", {"name": "ha-term", "egress": "allow"})
    assert status == 201, job
    status, kept = api.call(a, "POST", f"/api/v1/jobs/{job['id']}/acquire/", ACQUIRE)
    assert status == 200, kept

    ports = {a.identity: a.port, b.identity: b.port}
    service = LabelService(
        lambda: next((ports[p] for p in ports if leader_label(cluster, p) == "true"), None)
    )
    rig["cleanup"] = service.close
    # In flight on the leader when it is told to stop: its create is held by the stand-in.
    create_held = cluster.gates.add("create_stored", name_prefix=f"sm-{job['id']}-")
    in_flight = Trainer(Client(service.url, token, failover_s=120), job["id"])
    create_held.wait_reached(60)
    # Started during the failover at the standby: refused with Retry-After until it leads.
    waits: list[float] = []
    refused = threading.Event()

    def backoff(seconds: float) -> None:  # the client's own wait, recorded
        waits.append(seconds)
        refused.set()
        time.sleep(seconds)

    at_standby = Trainer(Client(b.url, token, failover_s=120, sleep=backoff), job["id"])
    assert refused.wait(60), "the standby never refused"
    assert waits[0] == 1.0  # Retry-After: the standby's retry period (1 s)
    wait_until(  # the leader renewed while its informers watched (the standby has none)
        lambda: any(w["open_watches"] > 0 for w in cluster.lease_writes(SERVICE_NS, LEASE_NAME)),
        what="a renewal while the leader's controller runs",
    )

    a.proc.send_signal(signal.SIGTERM)
    cluster.gates.release_all()  # the held create answers while the leader stops
    assert a.terminate() == 0, a.output()  # an orderly exit
    wait_until(lambda: status_of(b, "/readyz") == 200, what="the standby to lead")
    first, second = in_flight.join(90), at_standby.join(90)
    assert isinstance(first, ClientSandbox), first
    assert isinstance(second, ClientSandbox), second

    # The Lease, write by write: the old leader released it (empty holder, 1 s) with no
    # watch of its informers still open -- its controller had stopped -- and only then did
    # the standby take it, before the old record could have expired.
    writes = cluster.lease_writes(SERVICE_NS, LEASE_NAME)
    holders = [w["lease"]["spec"]["holderIdentity"] for w in writes]
    released = holders.index("")
    assert writes[released]["lease"]["spec"]["leaseDurationSeconds"] == 1
    assert holders[released - 1] == a.identity and b.identity not in holders[:released]
    assert holders[released + 1] == b.identity
    assert writes[released]["open_watches"] == 0
    last_renewal = writes[released - 1]["lease"]["spec"]["renewTime"]
    taken = writes[released + 1]["lease"]["spec"]["acquireTime"]
    assert _time(taken) < _time(last_renewal) + dt.timedelta(seconds=60)
    release_at = _time(writes[released]["lease"]["spec"]["renewTime"])
    print(f"standby acquired {(_time(taken) - release_at).total_seconds():.2f} s after the release")
    assert lease_holder(cluster) == b.identity and leader_label(cluster, b.identity) == "true"
    assert leader_label(cluster, a.identity) is None

    # Exactly one sandbox per acquire: no key was handed two, and the job's in-use
    # sandboxes are the three the trainers hold.
    handed: dict[str, set[int]] = {}
    for key, sandbox_id in Acquisition.objects.filter(
        job_id=job["id"], outcome="ok", sandbox_id__isnull=False
    ).values_list("idempotency_key", "sandbox_id"):
        if key:
            handed.setdefault(key, set()).add(sandbox_id)
    assert all(len(ids) == 1 for ids in handed.values()), handed
    held = {kept["sandbox_id"], first.sandbox_id, second.sandbox_id}
    assert len(held) == 3
    in_use = Sandbox.objects.filter(job_id=job["id"], state="in_use")
    assert set(in_use.values_list("pk", flat=True)) == held, history(job["id"])
    assert audit(cluster, None, at="after the SIGTERM failover").ownerless == []

    first.release()
    second.release()
    assert api.call(b, "POST", f"/api/v1/sandboxes/{kept['sandbox_id']}/release/", {})[0] == 200
    assert api.call(b, "POST", f"/api/v1/jobs/{job['id']}/drain/")[0] == 202
    wait_until(
        lambda: Job.objects.get(pk=job["id"]).state == "drained", what="the drain", deadline_s=90
    )
    assert sandman_pods(cluster) == []
    assert b.proc.poll() is None, b.output()


def _time(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
