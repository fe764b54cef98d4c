"""Two ``manage.py run_controller`` processes on one PostgreSQL, leader election on.

The controller processes of split processes (architecture §3.1), without their web
workers (the workers only call the socket; ``test_split_processes.py`` covers them):
the Kubernetes backend against the stand-in API server (in this process, over HTTP),
each process with its own identity, pod and socket, on a Lease longer than the test.

* The standby's socket does not listen while the other process holds the Lease
  (``run_controller`` listens only once its controller started, and a standby's starts
  when it takes the Lease); the leader's answers.
* SIGTERM (what the kubelet sends a pod it deletes:
  https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination)
  stops the leader in order -- socket, controller, then the Lease released as client-go's
  ``ReleaseOnCancel`` does: an empty holder and a 1 s duration written by the holder
  (https://pkg.go.dev/k8s.io/client-go/tools/leaderelection#LeaderElectionConfig) with
  no watch of its informers open, before any write by another identity. The old process
  exits 0; the standby takes the Lease at its next retry, long before the old record could
  have expired (Leases: https://kubernetes.io/docs/concepts/architecture/leases/), and
  only then listens.
* A SIGTERM after a process took the Lease but while its controller still starts (the
  stand-in holds its reconcile's list of the sandbox pods) waits for the start, then stops
  in the same order and releases the Lease; the process exits 0.
* ``k8s/sandman.yaml``'s liveness probe of the controller container passes on both: the
  leader answers its ``ping``, the standby has no socket.
"""

from __future__ import annotations

import os
import signal
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandboxes.tests.test_k8s_manifests import _render, _run_liveness_probe
from sandman_site.testing.replicas import ControllerProcess
from sandman_site.tests.test_failover import (
    LEASE_NAME,
    LONG_LEASE,
    SERVICE_NS,
    _time,
    leader_label,
    lease_holder,
    replica_env,
)
from standin import StandinCluster
from standin.gates import GateContext
from standin.harness.support import NS, other_tenant_pod, wait_until
from standin.kubeconfig import write_kubeconfig

pytestmark = pytest.mark.skipif(
    not os.environ.get("DATABASE_URL"), reason="the processes share one PostgreSQL"
)


@pytest.fixture
def rig(transactional_db: None) -> Iterator[dict[str, Any]]:
    cluster = StandinCluster(nodes=2)
    cluster.start()
    tmp = Path(tempfile.mkdtemp(prefix="sandman-ctl-failover-"))
    processes: list[ControllerProcess] = []
    rig = {
        "cluster": cluster,
        "processes": processes,
        "kubeconfig": write_kubeconfig(tmp / "kubeconfig", cluster.url, namespace=NS),
        "tmp": tmp,
    }
    try:
        yield rig
    finally:
        for process in processes:
            process.stop()
        cluster.stop()


def answers(path: Path) -> bool:
    """Something accepts connections on the Unix socket ``path``."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:  # no socket file, or nothing listening on it
            return False
    return True


def test_run_controller_releases_its_lease_on_sigterm_and_the_standby_listens_only_once_it_leads(
    rig,
):
    cluster: StandinCluster = rig["cluster"]
    identities = ("controller-a", "controller-b")
    for name in identities:  # the pods the controller processes run in (the leader labels its)
        cluster.put_pod(SERVICE_NS, other_tenant_pod(name, labels={"app": "sandman"}))
    a, b = (
        ControllerProcess(i, {**replica_env(i, rig["kubeconfig"]), **LONG_LEASE}, rig["tmp"])
        for i in identities
    )
    rig["processes"] += [a, b]  # started together; whichever takes the Lease first leads
    a, b = wait_until(
        lambda: (a, b) if a.listening.is_set() else (b, a) if b.listening.is_set() else None,
        what="a controller process to lead",
        deadline_s=120,
    )
    assert lease_holder(cluster) == a.identity and answers(a.socket)
    manifests = _render()  # k8s/sandman.yaml's liveness probe of the controller container
    assert _run_liveness_probe(manifests, a.socket) == 0  # the leader answers its ping
    wait_until(  # the leader renewed while its informers watched: its controller runs
        lambda: any(
            w["open_watches"] > 0 and w["lease"]["spec"]["holderIdentity"] == a.identity
            for w in cluster.lease_writes(SERVICE_NS, LEASE_NAME)
        ),
        what="a renewal while the leader's controller runs",
    )
    # The standby runs, retrying the Lease, and listens on nothing.
    assert b.proc.poll() is None, b.output()
    assert not b.listening.is_set() and not b.socket.exists() and not answers(b.socket)
    assert _run_liveness_probe(manifests, b.socket) == 0  # a standby is alive
    holders = [
        w["lease"]["spec"]["holderIdentity"] for w in cluster.lease_writes(SERVICE_NS, LEASE_NAME)
    ]
    assert b.identity not in holders
    assert (leader_label(cluster, a.identity), leader_label(cluster, b.identity)) == ("true", None)

    assert a.terminate() == 0, a.output()  # SIGTERM: an orderly exit
    assert not a.socket.exists()
    assert b.listening.wait(60), b.output()
    assert answers(b.socket) and lease_holder(cluster) == b.identity

    # The Lease, write by write: the old leader released it (empty holder, 1 s) with no watch
    # of its informers still open -- its controller had stopped -- and only then did the
    # standby take it, before the old record could have expired.
    writes = cluster.lease_writes(SERVICE_NS, LEASE_NAME)
    holders = [w["lease"]["spec"]["holderIdentity"] for w in writes]
    released = holders.index("")
    assert writes[released]["lease"]["spec"]["leaseDurationSeconds"] == 1
    assert holders[released - 1] == a.identity and b.identity not in holders[:released]
    assert writes[released]["open_watches"] == 0
    assert holders[released + 1] == b.identity
    last_renewal = _time(writes[released - 1]["lease"]["spec"]["renewTime"])
    taken = _time(writes[released + 1]["lease"]["spec"]["acquireTime"])
    assert (taken - last_renewal).total_seconds() < 60  # LONG_LEASE's duration
    assert leader_label(cluster, a.identity) is None
    assert leader_label(cluster, b.identity) == "true"
    assert b.proc.poll() is None, b.output()


def test_a_sigterm_while_the_new_holder_reconciles_still_ends_in_an_orderly_release(rig):
    """SIGTERM after the Lease is taken but before the controller started (its reconcile's
    list of the sandbox pods is held by the stand-in): the process lets the start
    finish, then stops it and releases the Lease, and exits 0 -- rather than leave a
    holder whose socket never listens until the kubelet's SIGKILL and the Lease expires."""
    cluster: StandinCluster = rig["cluster"]
    cluster.put_pod(SERVICE_NS, other_tenant_pod("controller-c", labels={"app": "sandman"}))

    # The provider's start lists Sandman's pods twice, in two threads, with the same query:
    # the pod informer's list and the reconcile's. Either may reach the stand-in first, so
    # both are held (a gate holds one call): holding one alone let the reconcile end before
    # the signal whenever the informer's list came first.
    def pod_list(ctx: GateContext) -> bool:
        return ctx.kind == "pods" and ctx.namespace == NS

    lists_held = [cluster.gates.add("list_received", pod_list) for _ in range(2)]
    c = ControllerProcess(
        "controller-c", {**replica_env("controller-c", rig["kubeconfig"]), **LONG_LEASE}, rig["tmp"]
    )
    rig["processes"].append(c)
    for held in lists_held:
        held.wait_reached(120)
    assert lease_holder(cluster) == c.identity and not c.listening.is_set()
    c.proc.send_signal(signal.SIGTERM)
    wait_until(  # the stop is taken while the start is under way (not after it ended)
        lambda: "its controller is starting: waiting" in c.output(), what="the stop to wait"
    )
    for held in lists_held:
        held.release()
    assert c.proc.wait(timeout=120) == 0, c.output()
    holders = [
        w["lease"]["spec"]["holderIdentity"] for w in cluster.lease_writes(SERVICE_NS, LEASE_NAME)
    ]
    assert holders[-1] == "" and set(holders[:-1]) == {c.identity}, holders
    assert leader_label(cluster, c.identity) is None
    assert not c.socket.exists()
