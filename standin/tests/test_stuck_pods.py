"""Pods that get stuck as on a real cluster: image pulls that fail, scheduling gates."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from standin import StandinCluster
from standin.tests.conftest import NS, core_for, pod


def _waiting(p: dict[str, Any], key: str) -> dict[str, Any]:
    (status,) = [s for s in p["status"][key] if "waiting" in s["state"]][:1]
    return dict(status["state"]["waiting"], name=status["name"])


def _condition(p: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next(c for c in p["status"]["conditions"] if c["type"] == ctype)


def _messages(cluster: StandinCluster, name: str) -> list[tuple[str, str, str]]:
    return [
        (e["type"], e["reason"], e["message"])
        for e in cluster.events()
        if e["involvedObject"]["name"] == name
    ]


def test_a_bad_task_image_goes_err_image_pull_then_image_pull_back_off(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """Kubernetes -- Images, "ImagePullBackOff"
    (https://kubernetes.io/docs/concepts/containers/images/#imagepullbackoff): the kubelet
    reports ErrImagePull, then backs off (10 s, doubling to 300 s) as ImagePullBackOff; the
    pod stays Pending. Events as ``kubectl describe pod`` shows them (Failed 'Failed to
    pull image "x": rpc error: code = NotFound ...', Failed "Error: ErrImagePull", BackOff
    'Back-off pulling image "x"', Failed "Error: ImagePullBackOff")."""
    cluster = make_cluster(nodes=1, mode="manual")
    cluster.plans.add("pod", "bad_image", name_prefix="bad")
    core_for(cluster).create_namespaced_pod(NS, pod("bad", image="task/missing:1"))
    cluster.advance(1.0)  # scheduled, addressed, the first pull failed
    first = cluster.pod(NS, "bad")
    assert first is not None and _waiting(first, "containerStatuses")["reason"] == "ErrImagePull"
    cluster.run_until_idle()
    p = cluster.pod(NS, "bad")
    assert p is not None and p["status"]["phase"] == "Pending"
    waiting = _waiting(p, "containerStatuses")
    assert waiting == {
        "name": "sandbox",
        "reason": "ImagePullBackOff",
        "message": 'Back-off pulling image "task/missing:1"',
    }
    messages = _messages(cluster, "bad")
    assert ("Warning", "Failed", "Error: ErrImagePull") in messages
    assert ("Warning", "Failed", "Error: ImagePullBackOff") in messages
    assert ("Normal", "BackOff", 'Back-off pulling image "task/missing:1"') in messages
    failed = [m for t, r, m in messages if r == "Failed" and m.startswith("Failed to pull")]
    assert failed and "code = NotFound" in failed[0] and "not found" in failed[0]
    pulls = [e for e in cluster.events() if e["reason"] == "Pulling"]
    assert pulls[0]["count"] == 3  # three attempts, aggregated on one Event


def test_a_carrier_outage_leaves_the_init_container_waiting_and_the_pod_uninitialized(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """Kubernetes -- Init Containers
    (https://kubernetes.io/docs/concepts/workloads/pods/init-containers/): while an init
    container cannot start the pod is Pending with ``Initialized`` False
    (ContainersNotInitialized); its status waits in ErrImagePull / ImagePullBackOff."""
    cluster = make_cluster(nodes=1, mode="manual")
    cluster.plans.add("pod", "carrier_outage", name_prefix="c")
    body = pod("c")
    body["spec"]["initContainers"] = [{"name": "execd-carrier", "image": "reg.example/carrier:1"}]
    core_for(cluster).create_namespaced_pod(NS, body)
    cluster.run_until_idle()
    p = cluster.pod(NS, "c")
    assert p is not None and p["status"]["phase"] == "Pending"
    waiting = _waiting(p, "initContainerStatuses")
    assert (waiting["name"], waiting["reason"]) == ("execd-carrier", "ImagePullBackOff")
    cond = _condition(p, "Initialized")
    assert (cond["status"], cond["reason"]) == ("False", "ContainersNotInitialized")
    failed = [m for _, r, m in _messages(cluster, "c") if m.startswith("Failed to pull")]
    assert failed and "code = Unavailable" in failed[0] and "i/o timeout" in failed[0]
    assert not [e for e in cluster.events() if e["reason"] == "Started"]


def test_a_scheduling_gate_holds_the_pod_until_it_is_removed(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """Kubernetes -- Pod Scheduling Readiness
    (https://kubernetes.io/docs/concepts/scheduling-eviction/pod-scheduling-readiness/): a
    pod with ``spec.schedulingGates`` is not scheduled; PodScheduled is False with reason
    SchedulingGated; once a client removes the gates the scheduler takes the pod. Here a
    create plan plays the mutating webhook that adds the gate."""
    cluster = make_cluster(nodes=1, mode="manual")
    cluster.plans.add("create", "scheduling_gate", name_prefix="g")
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("g"))
    cluster.run_until_idle()
    p = cluster.pod(NS, "g")
    assert p is not None and not p["spec"].get("nodeName")
    cond = _condition(p, "PodScheduled")
    assert (cond["status"], cond["reason"]) == ("False", "SchedulingGated")
    assert cond["message"] == "Scheduling is blocked due to non-empty scheduling gates"
    assert not [e for e in cluster.events() if e["reason"] == "FailedScheduling"]
    core.patch_namespaced_pod("g", NS, {"spec": {"schedulingGates": None}})
    cluster.run_until_idle()
    p = cluster.pod(NS, "g")
    assert p is not None and p["spec"]["nodeName"] == "node-0"
    assert _condition(p, "Ready")["status"] == "True"


def test_an_evicted_pod_is_failed_with_reason_evicted_and_stays_stored(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """Kubernetes -- Node-pressure Eviction
    (https://kubernetes.io/docs/concepts/scheduling-eviction/node-pressure-eviction/): the
    kubelet fails the pod (phase Failed, reason Evicted) and it stays until deleted; Pod
    disruption conditions -- ``DisruptionTarget`` reason TerminationByKubelet
    (https://kubernetes.io/docs/concepts/workloads/pods/disruptions/#pod-disruption-conditions)."""
    cluster = make_cluster(nodes=1, mode="manual")
    core_for(cluster).create_namespaced_pod(NS, pod("e"))
    cluster.run_until_idle()
    assert cluster.evict_pod(NS, "e") is True
    p = cluster.pod(NS, "e")
    assert p is not None and (p["status"]["phase"], p["status"]["reason"]) == ("Failed", "Evicted")
    assert p["status"]["message"].startswith("The node was low on resource: memory.")
    target = _condition(p, "DisruptionTarget")
    assert (target["status"], target["reason"]) == ("True", "TerminationByKubelet")
    assert _condition(p, "Ready")["status"] == "False"
    assert ("Warning", "Evicted", p["status"]["message"]) in _messages(cluster, "e")
    assert cluster.nodes()[0]["pods"] == 0  # its resources are free again


def test_a_lost_node_is_ready_unknown_and_its_pods_turn_not_ready(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """Kubernetes -- Nodes, "Node status" / Taint-based evictions
    (https://kubernetes.io/docs/concepts/architecture/nodes/#condition): a node that stops
    reporting is Ready Unknown, takes no new pods, and the node lifecycle controller marks
    its pods Ready False ("NodeNotReady": "Node is not ready")."""
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("a"))
    cluster.run_until_idle()
    assert cluster.lose_node("node-0") == 1
    p = cluster.pod(NS, "a")
    assert p is not None and p["status"]["phase"] == "Running"
    assert _condition(p, "Ready")["status"] == "False"
    assert ("Warning", "NodeNotReady", "Node is not ready") in _messages(cluster, "a")
    assert cluster.nodes()[0]["ready"] == "Unknown"
    core.create_namespaced_pod(NS, pod("later"))
    cluster.run_until_idle()
    later = cluster.pod(NS, "later")
    assert later is not None and _condition(later, "PodScheduled")["reason"] == "Unschedulable"


def test_a_failing_readiness_probe_flips_ready_back_to_false(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """Kubernetes -- Configure Liveness, Readiness and Startup Probes
    (https://kubernetes.io/docs/tasks/configure-pod-container/configure-liveness-readiness-startup-probes/):
    a failing readiness probe sets Ready False; the kubelet records Unhealthy."""
    cluster = make_cluster(nodes=1, mode="manual")
    core_for(cluster).create_namespaced_pod(NS, pod("r"))
    cluster.run_until_idle()
    assert cluster.fail_probe(NS, "r") is True
    cluster.run_until_idle()
    p = cluster.pod(NS, "r")
    assert p is not None and _condition(p, "Ready")["status"] == "False"
    unhealthy = [m for t, r, m in _messages(cluster, "r") if r == "Unhealthy"]
    assert unhealthy and unhealthy[0].startswith("Readiness probe failed: Get ")
