"""The controller over pods that stay Terminating: one DELETE each, nothing ownerless.

The stand-in deletes gracefully, as a real API server and kubelet do ("Pod Lifecycle --
Termination of Pods", https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/
#pod-termination): a deleted pod stays listed, Terminating, until its kubelet has stopped
it -- longer than its grace period when the node's kubelet cannot reach the API server.
A sandbox row stays ``deleting`` (still holding its node's capacity and its address, see
docs/architecture.md) until the pod is gone, so a sweep under churn neither lists a
Terminating pod as ownerless nor DELETEs it again.
"""

from __future__ import annotations

import datetime as dt

import pytest

from sandboxes.controller.hooks import ControllerHooks
from sandboxes.models import PendingDelete
from sandboxes.tests.controller_support import acquire_args, make_job, state, wait_until
from standin import StandinCluster
from standin.harness.support import NS, k8s_provider


@pytest.mark.django_db(transaction=True)
def test_churn_over_terminating_pods_sends_one_delete_each_and_finds_nothing_ownerless(
    make_controller,
):
    cluster = StandinCluster(nodes=2, run_execd=True)
    cluster.start()
    seen: list[list[str]] = []

    def ownerless(names: list[str], now: dt.datetime) -> None:
        seen.append(names)

    controller = None
    try:
        controller = make_controller(
            provider=k8s_provider(cluster, destroy_attempts=2),
            hooks=ControllerHooks(ownerless_found=ownerless),
        )
        job = make_job(max_live=8)
        got = [controller.acquire(**acquire_args(job)) for _ in range(6)]
        for node in ("node-0", "node-1"):  # kubelets cut off: deleted pods stay Terminating
            cluster.partition_node(node)
        for g in got:
            controller.release(sandbox_id=g.sandbox_id, verdict="pass")
        wait_until(
            lambda: (
                all(p["metadata"].get("deletionTimestamp") for p in cluster.pods(NS))
                and cluster.request_counts()[("delete", "pods")] == len(got)
            ),
            what="every released pod Terminating",
        )
        report = controller.sweep()
        assert (report["listed"], report["ownerless"], report["deleted"]) == (len(got), 0, 0)
        assert seen == []
        assert all(state(g.sandbox_id) == "deleting" for g in got)  # still holding its place
        for node in ("node-0", "node-1"):
            cluster.heal_node(node)
        wait_until(lambda: all(state(g.sandbox_id) == "deleted" for g in got), what="rows ended")
        assert cluster.pods(NS) == [] and PendingDelete.objects.count() == 0
        assert cluster.request_counts()[("delete", "pods")] == len(got)
        again = controller.sweep()
        assert (again["listed"], again["ownerless"]) == (0, 0) and seen == []
    finally:
        if controller is not None:
            controller.stop()  # before the cluster: its informer and deletes talk to it
        cluster.gates.release_all()
        cluster.stop()
