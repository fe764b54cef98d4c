"""Graceful deletion: a deleted pod stays Terminating for its grace period, then goes.

Imitates "Pod Lifecycle -- Termination of Pods",
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-termination (the API
server records the grace period in ``deletionTimestamp`` / ``deletionGracePeriodSeconds``;
the pod is Terminating, still listed and watched, until the kubelet has stopped it and the
pod is removed; ``--grace-period=0`` force-deletes; a pod on a node that cannot be reached
stays until its kubelet is back or it is force-deleted) and "Kubernetes API Concepts",
https://kubernetes.io/docs/reference/using-api/api-concepts/ and "Finalizers",
https://kubernetes.io/docs/concepts/overview/working-with-objects/finalizers/ (an object
with finalizers is only marked for deletion until they are removed). All on the stand-in's
manual simulated clock.
"""

from __future__ import annotations

import json
import queue
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client, watch

from standin import StandinCluster
from standin.scheduler import NodeSpec, make_nodes
from standin.status import parse_rfc3339
from standin.tests.conftest import NS, core_for, pod

MakeCluster = Callable[..., StandinCluster]


def _running(cluster: StandinCluster, core: client.CoreV1Api, name: str, **spec: Any) -> None:
    body = pod(name)
    body["spec"].update(spec)
    core.create_namespaced_pod(NS, body)
    cluster.advance(10)  # scheduled, addressed, started, Ready
    assert cluster.pod(NS, name)["spec"].get("nodeName")  # type: ignore[index]


def _grace(cluster: StandinCluster, name: str) -> tuple[int, float] | None:
    p = cluster.pod(NS, name)
    if p is None:
        return None
    meta = p["metadata"]
    when = parse_rfc3339(meta["deletionTimestamp"]).timestamp()
    return meta["deletionGracePeriodSeconds"], when


def test_a_deleted_pod_is_terminating_for_its_grace_period_and_then_gone(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    _running(cluster, core, "p", terminationGracePeriodSeconds=20)
    answer = core.delete_namespaced_pod("p", NS)
    assert answer.metadata.deletion_timestamp is not None
    assert answer.metadata.deletion_grace_period_seconds == 20
    listed = core.list_namespaced_pod(NS).items
    assert [p.metadata.name for p in listed] == ["p"]
    assert listed[0].metadata.deletion_timestamp == answer.metadata.deletion_timestamp
    cluster.advance(19.5)
    assert cluster.pod(NS, "p") is not None  # still Terminating
    cluster.advance(1)
    assert cluster.pod(NS, "p") is None
    with pytest.raises(client.ApiException) as caught:
        core.read_namespaced_pod("p", NS)
    assert caught.value.status == 404


def test_the_watch_sees_modified_with_a_deletion_timestamp_then_deleted(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    _running(cluster, core, "p", terminationGracePeriodSeconds=5)
    version = core.list_namespaced_pod(NS).metadata.resource_version
    events: queue.Queue[dict[str, Any]] = queue.Queue()

    def stream() -> None:
        w = watch.Watch()
        for event in w.stream(
            core.list_namespaced_pod, NS, resource_version=version, timeout_seconds=30
        ):
            events.put(event)
            if event["type"] == "DELETED":
                w.stop()

    reader = threading.Thread(target=stream, daemon=True)
    reader.start()
    assert cluster.wait_for_watchers(1)
    core.delete_namespaced_pod("p", NS)
    first = events.get(timeout=10)
    assert first["type"] == "MODIFIED" and first["object"].metadata.deletion_timestamp
    cluster.advance(5)
    second = events.get(timeout=10)
    assert second["type"] == "DELETED"
    reader.join(timeout=10)


def test_the_grace_period_comes_from_the_request_else_the_spec_else_30_seconds(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    _running(cluster, core, "default")
    _running(cluster, core, "spec", terminationGracePeriodSeconds=7)
    _running(cluster, core, "asked", terminationGracePeriodSeconds=7)
    now = cluster.state()["sim_time"]
    core.delete_namespaced_pod("default", NS)
    core.delete_namespaced_pod("spec", NS)
    core.delete_namespaced_pod("asked", NS, grace_period_seconds=3)
    grace = {n: _grace(cluster, n) for n in ("default", "spec", "asked")}
    assert {n: g[0] for n, g in grace.items() if g} == {"default": 30, "spec": 7, "asked": 3}
    cluster.advance(3)
    assert {p["metadata"]["name"] for p in cluster.pods(NS)} == {"default", "spec"}
    cluster.advance(4)
    assert [p["metadata"]["name"] for p in cluster.pods(NS)] == ["default"]
    cluster.advance(23)
    assert cluster.pods(NS) == [] and cluster.state()["sim_time"] == pytest.approx(now + 30)


def test_a_second_delete_never_restarts_the_clock_but_may_shorten_it(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    _running(cluster, core, "p", terminationGracePeriodSeconds=10)
    core.delete_namespaced_pod("p", NS)
    first = _grace(cluster, "p")
    cluster.advance(6)
    again = core.delete_namespaced_pod("p", NS)  # 10 s again from now would be later
    assert again.metadata.deletion_grace_period_seconds == 10
    assert _grace(cluster, "p") == first
    core.delete_namespaced_pod("p", NS, grace_period_seconds=1)  # sooner: taken
    assert _grace(cluster, "p")[0] == 1  # type: ignore[index]
    cluster.advance(1)
    assert cluster.pod(NS, "p") is None


def test_a_pod_never_scheduled_and_a_force_delete_go_at_once(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("pending"))  # manual mode: nothing scheduled it yet
    core.delete_namespaced_pod("pending", NS)
    assert cluster.pod(NS, "pending") is None
    _running(cluster, core, "running")
    core.delete_namespaced_pod("running", NS, grace_period_seconds=0)
    assert cluster.pod(NS, "running") is None


def test_finalizers_hold_a_deleted_object_until_a_patch_removes_them(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    body = pod("held")
    body["metadata"]["finalizers"] = ["example.com/keep"]
    body["spec"]["terminationGracePeriodSeconds"] = 2
    core.create_namespaced_pod(NS, body)
    cluster.advance(10)
    core.delete_namespaced_pod("held", NS)
    cluster.advance(60)
    held = cluster.pod(NS, "held")
    assert held is not None and held["metadata"]["deletionGracePeriodSeconds"] == 0
    cm = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cm", finalizers=["x/y"]))
    core.create_namespaced_config_map(NS, cm)
    core.delete_namespaced_config_map("cm", NS)
    assert cluster.configmaps(NS)[0]["metadata"]["deletionTimestamp"]
    # A client's patch cannot clear the deletion; removing the last finalizer ends it.
    core.patch_namespaced_pod("held", NS, {"metadata": {"deletionTimestamp": None}})
    assert cluster.pod(NS, "held")["metadata"]["deletionTimestamp"]  # type: ignore[index]
    core.patch_namespaced_pod("held", NS, {"metadata": {"finalizers": None}})
    core.patch_namespaced_config_map("cm", NS, {"metadata": {"finalizers": []}})
    assert cluster.pod(NS, "held") is None and cluster.configmaps(NS) == []


def test_a_pod_on_a_partitioned_node_stays_terminating_until_healed_or_forced(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    _running(cluster, core, "a", terminationGracePeriodSeconds=5)
    _running(cluster, core, "b", terminationGracePeriodSeconds=5)
    cluster.partition_node("node-0")
    core.delete_namespaced_pod("a", NS)
    core.delete_namespaced_pod("b", NS)
    cluster.advance(300)
    assert {p["metadata"]["name"] for p in cluster.pods(NS)} == {"a", "b"}
    core.delete_namespaced_pod("a", NS, grace_period_seconds=0)  # kubectl --force
    assert [p["metadata"]["name"] for p in cluster.pods(NS)] == ["b"]
    assert cluster.heal_node("node-0") == 1
    cluster.advance(0)
    assert cluster.pods(NS) == []


def test_a_terminating_pod_holds_its_node_capacity_until_it_is_gone(
    make_cluster: MakeCluster,
) -> None:
    cluster = make_cluster(nodes=[NodeSpec("node-0", cpu="1", memory="4Gi")], mode="manual")
    core = core_for(cluster)
    _running(cluster, core, "old", terminationGracePeriodSeconds=10)
    core.delete_namespaced_pod("old", NS)
    core.create_namespaced_pod(NS, pod("new", cpu="1"))  # fits only once "old" is gone
    cluster.advance(5)
    assert cluster.nodes()[0]["allocated_cpu_millis"] == 500
    assert not cluster.pod(NS, "new")["spec"].get("nodeName")  # type: ignore[index]
    cluster.advance(10)
    assert cluster.pod(NS, "old") is None
    assert cluster.pod(NS, "new")["spec"].get("nodeName") == "node-0"  # type: ignore[index]


def test_an_address_is_not_handed_out_again_while_its_pod_holds_it() -> None:
    (node,) = make_nodes(1)
    first = node.pod_ip("uid-old")
    node.add_pod("uid-old", 1, 1, {}, NS)
    later = [node.pod_ip(f"uid-{i}") for i in range(252)]
    assert first not in later  # the whole range came round without reusing it
    node.remove_pod("uid-old")
    for i in range(252):
        node.remove_pod(f"uid-{i}")
    assert node.pod_ip("uid-new") == first


def test_a_bad_grace_period_is_a_400_not_a_5xx(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core_for(cluster).create_namespaced_pod(NS, pod("p"))
    request = urllib.request.Request(
        f"{cluster.url}/api/v1/namespaces/{NS}/pods/p",
        data=json.dumps({"gracePeriodSeconds": "soon"}).encode(),
        headers={"Content-Type": "application/json"},
        method="DELETE",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 400
    assert json.loads(caught.value.read())["code"] == 400
    assert cluster.pod(NS, "p") is not None
