"""The simulated scheduler and kubelet: stages, spread vs packing, addresses, image cache."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from kubernetes import client

from standin import AddressModel, NodeSpec, StandinCluster
from standin import keys as K
from standin.status import parse_rfc3339
from standin.tests.conftest import NS, core_for, pod

SPREAD = {
    "maxSkew": 2,
    "topologyKey": "kubernetes.io/hostname",
    "whenUnsatisfiable": "ScheduleAnyway",
    "labelSelector": {"matchLabels": {"job": "1"}},
}


def _run_burst(
    make_cluster: Callable[..., StandinCluster], *, spread: bool, seed: int = 7
) -> tuple[dict[str, Any], Counter[str]]:
    cluster = make_cluster(
        nodes=4, mode="manual", seed=seed, address_model=AddressModel(warm_addresses=2, slope=0.05)
    )
    core = core_for(cluster)
    for i in range(20):
        core.create_namespaced_pod(
            NS,
            pod(
                f"p{i:02d}",
                labels={"job": "1"},
                cpu="100m",
                memory="128Mi",
                spread=SPREAD if spread else None,
            ),
        )
    cluster.run_until_idle()
    pods = cluster.pods(NS)
    assert all(_condition(p, "Ready") for p in pods)
    per_node = Counter(p["spec"]["nodeName"] for p in pods)
    core.api_client.close()
    return cluster.address_failures(), per_node


def _events(cluster: StandinCluster, name: str, path: str = "spec.containers{sandbox}") -> list:
    """The pod's Events in the order they were recorded (Scheduled has no fieldPath)."""
    return [
        e
        for e in cluster.events()
        if e["involvedObject"]["name"] == name
        and e["involvedObject"].get("fieldPath", path) == path
    ]


def _pull_s(cluster: StandinCluster, name: str) -> float:
    (pulled,) = [e["message"] for e in _events(cluster, name) if e["reason"] == "Pulled"]
    took = pulled.split(" in ", 1)[1].split(" ", 1)[0]
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    return sum(float(n) * units[u] for n, u in re.findall(r"([0-9.]+)(ms|h|m|s)", took))


def _condition(p: dict[str, Any], ctype: str) -> bool:
    return any(
        c["type"] == ctype and c["status"] == "True" for c in p["status"].get("conditions", [])
    )


def test_a_pod_moves_through_every_stage_with_ordered_stamps(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    cluster = make_cluster(nodes=2, mode="manual")
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("p"))
    assert cluster.pod(NS, "p")["status"]["phase"] == "Pending"
    cluster.run_until_idle()
    p = cluster.pod(NS, "p")
    assert not any(
        k.startswith("standin.sandman.dev/") for k in p["metadata"].get("annotations") or {}
    )
    events = _events(cluster, "p")
    assert [e["reason"] for e in events] == ["Scheduled", "Pulling", "Pulled", "Created", "Started"]
    stamps = [parse_rfc3339(events[0]["eventTime"])]
    stamps += [parse_rfc3339(e["lastTimestamp"]) for e in events[1:]]
    stamps.append(
        parse_rfc3339(
            next(c for c in p["status"]["conditions"] if c["type"] == "Ready")["lastTransitionTime"]
        )
    )
    assert [t.replace(microsecond=0) for t in stamps] == sorted(
        t.replace(microsecond=0) for t in stamps
    )
    assert (
        p["status"]["phase"] == "Running"
        and p["status"]["podIP"].startswith("127.")
        and p["status"]["podIP"] != "127.0.0.1"
    )
    assert p["spec"]["nodeName"] in {"node-0", "node-1"} and p["status"]["hostIP"]
    for ctype in ("PodScheduled", "Initialized", "ContainersReady", "Ready"):
        assert _condition(p, ctype), ctype
    assert p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
    assert (
        events[2]["message"].startswith('Successfully pulled image "') and _pull_s(cluster, "p") > 0
    )


def test_spread_lowers_address_failures_versus_packing(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """Table A13 / §5.2: a packed burst concentrates on one node and fails addresses there;
    the soft spread (maxSkew 2) puts at most a few pods per node and fails far fewer."""
    packed_failures, packed_nodes = _run_burst(make_cluster, spread=False)
    spread_failures, spread_nodes = _run_burst(make_cluster, spread=True)
    assert packed_nodes == Counter({"node-0": 20})  # most-allocated: fill the first node
    assert max(spread_nodes.values()) - min(spread_nodes.values()) <= 2 and len(spread_nodes) == 4
    assert spread_failures["total"] < packed_failures["total"]
    assert packed_failures["by_node"]["node-0"] == packed_failures["total"] > 0
    again, _ = _run_burst(make_cluster, spread=False)
    assert again == packed_failures  # same seed, same order: same failures


def test_address_failures_are_recorded_on_the_pod_and_as_events(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    failures, _ = _run_burst(make_cluster, spread=False)
    assert failures["total"] == sum(failures["by_pod"].values())


def test_second_pod_on_a_node_finds_the_image_present(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("first"))
    cluster.run_until_idle()
    core.create_namespaced_pod(NS, pod("second"))
    cluster.run_until_idle()
    first = [e["message"] for e in _events(cluster, "first") if e["reason"] == "Pulled"]
    second = [e["message"] for e in _events(cluster, "second") if e["reason"] == "Pulled"]
    assert first[0].startswith("Successfully pulled image") and _pull_s(cluster, "first") > 0
    assert second == ['Container image "task/img:1" already present on machine']


def test_pull_time_grows_with_image_size(make_cluster: Callable[..., StandinCluster]) -> None:
    cluster = make_cluster(nodes=2, mode="manual", images={"big": 1_210_000_000})
    core = core_for(cluster)
    core.create_namespaced_pod(
        NS, pod("small", image="small", annotations={K.IMAGE_BYTES: "43000000"})
    )
    core.create_namespaced_pod(NS, pod("big", image="big"))
    cluster.run_until_idle()
    assert _pull_s(cluster, "big") > 10 * _pull_s(cluster, "small")


def test_pods_beyond_capacity_wait_unschedulable_until_room_frees(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    cluster = make_cluster(nodes=[NodeSpec("tiny", cpu="1", memory="4Gi")], mode="manual")
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("a", cpu="600m"))
    core.create_namespaced_pod(NS, pod("b", cpu="600m"))
    cluster.run_until_idle()
    b = cluster.pod(NS, "b")
    assert b["status"]["phase"] == "Pending" and "nodeName" not in b["spec"]
    assert any(
        c["type"] == "PodScheduled" and c["reason"] == "Unschedulable"
        for c in b["status"]["conditions"]
    )
    core.delete_namespaced_pod("a", NS)
    cluster.run_until_idle()
    assert _condition(cluster.pod(NS, "b"), "Ready")


def test_pod_plans_fail_start_and_never_ready(make_cluster: Callable[..., StandinCluster]) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    cluster.plans.add("pod", "fail_start", name_prefix="bad")
    never = cluster.plans.add("pod", "never_ready", name_prefix="stuck")
    core = core_for(cluster)
    for name in ("bad", "stuck", "fine"):
        core.create_namespaced_pod(NS, pod(name))
    cluster.run_until_idle()
    bad, stuck, fine = (cluster.pod(NS, n) for n in ("bad", "stuck", "fine"))
    assert bad["status"]["phase"] == "Failed"
    assert bad["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1
    assert stuck["status"]["phase"] == "Running" and not _condition(stuck, "Ready")
    assert _condition(fine, "Ready") and never.fired == 1


def test_probe_and_ready_gates_hold_readiness(make_cluster: Callable[..., StandinCluster]) -> None:
    cluster = make_cluster(nodes=1)
    probe = cluster.gates.add("probe", name="p1")
    ready = cluster.gates.add("ready", name="p2")
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("p1"))
    core.create_namespaced_pod(NS, pod("p2"))
    probe.wait_reached(timeout=10)
    ready.wait_reached(timeout=10)
    assert not _condition(cluster.pod(NS, "p1"), "Ready") and not _condition(
        cluster.pod(NS, "p2"), "Ready"
    )
    for gate, name in ((probe, "p1"), (ready, "p2")):
        version = (
            client.CoreV1Api(core.api_client).list_namespaced_pod(NS).metadata.resource_version
        )
        gate.release()
        from kubernetes import watch

        for event in watch.Watch().stream(
            core.list_namespaced_pod, NS, resource_version=version, timeout_seconds=10
        ):
            if event["object"].metadata.name == name and _condition(event["raw_object"], "Ready"):
                break
        else:
            raise AssertionError(f"{name} never became Ready after its gate was released")
