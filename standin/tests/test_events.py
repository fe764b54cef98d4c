"""The stand-in's core/v1 Events: messages, aggregation, spam filter, TTL, list and watch."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable

from kubernetes import client

from standin import StandinCluster
from standin.events import COMBINED, EventLog, go_duration
from standin.store import Store
from standin.tests.conftest import NS, core_for, pod

EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
POD = {"kind": "Pod", "apiVersion": "v1", "metadata": {"namespace": NS, "name": "p", "uid": "u1"}}


def _log(clock: list[float], ttl_s: float = 3600.0) -> EventLog:
    store = Store(now=lambda: (EPOCH + dt.timedelta(seconds=clock[0])).isoformat())
    return EventLog(
        lambda: clock[0], lambda t: EPOCH + dt.timedelta(seconds=t), store=store, ttl_s=ttl_s
    )


def test_pod_start_is_told_in_events_with_the_scheduler_and_kubelet_messages(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """Kubernetes API Reference -- Event v1 core
    (https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/) and
    the messages ``kubectl describe pod`` shows (kube-scheduler ``schedule_one.go``: "Successfully
    assigned ns/pod to node"; kubelet ``images/image_manager.go``: 'Successfully pulled image
    "x" in 3.2s (3.2s including waiting). Image size: N bytes.' / 'Container image "x"
    already present on machine'; ``kuberuntime_container.go``: "Created container: x",
    "Started container x"). Scheduler Events come from events.k8s.io (``eventTime``),
    kubelet ones from the core/v1 recorder (``source``, ``count``, whole seconds)."""
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("first"))
    cluster.run_until_idle()
    core.create_namespaced_pod(NS, pod("second"))
    cluster.run_until_idle()
    listed = core.list_namespaced_event(NS, field_selector="involvedObject.name=first")
    by_reason = {(e.reason, e.involved_object.field_path): e for e in listed.items}
    main = "spec.containers{sandbox}"
    scheduled = by_reason[("Scheduled", None)]
    assert scheduled.message == f"Successfully assigned {NS}/first to node-0"
    assert scheduled.reporting_component == "default-scheduler" and scheduled.event_time
    pulled = by_reason[("Pulled", main)]
    assert re.fullmatch(
        r'Successfully pulled image "task/img:1" in (\S+) \(\1 including waiting\)\. '
        r"Image size: 43000000 bytes\.",
        pulled.message,
    )
    assert pulled.source.component == "kubelet" and pulled.source.host == "node-0"
    assert pulled.count == 1 and pulled.first_timestamp and pulled.type == "Normal"
    assert by_reason[("Pulling", main)].message == 'Pulling image "task/img:1"'
    assert by_reason[("Created", main)].message == "Created container: sandbox"
    assert by_reason[("Started", main)].message == "Started container sandbox"
    assert all(
        e.involved_object.uid == cluster.pod(NS, "first")["metadata"]["uid"] for e in listed.items
    )
    second = core.list_namespaced_event(NS, field_selector="involvedObject.name=second")
    assert [e.message for e in second.items if e.reason == "Pulled"] == [
        'Container image "task/img:1" already present on machine'
    ]
    assert go_duration(3.2) == "3.2s" and go_duration(0.512) == "512ms"
    assert go_duration(64.25) == "1m4.25s"


def test_a_repeated_event_bumps_count_and_last_timestamp_and_similar_ones_combine() -> None:
    """client-go ``tools/record/events_cache.go`` (the kubelet's EventCorrelator): an
    identical event updates ``count`` and ``lastTimestamp`` of the first one; the 10th
    similar event (same reason and object, other message) within 10 minutes becomes
    "(combined from similar events): ..." and later ones count on it. Kubernetes API
    Reference -- Event v1 core, fields ``count`` / ``lastTimestamp``
    (https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/)."""
    clock = [0.0]
    log = _log(clock)
    log.add("BackOff", POD, 'Back-off pulling image "x"', type="Warning", node="n")
    clock[0] = 5.0
    log.add("BackOff", POD, 'Back-off pulling image "x"', type="Warning", node="n")
    (event,) = log.list()
    assert event["count"] == 2 and event["firstTimestamp"] != event["lastTimestamp"]
    for i in range(12):
        log.add("FailedCreatePodSandBox", POD, f"sandbox {i}: failed", type="Warning", node="n")
    failed = [e for e in log.list() if e["reason"] == "FailedCreatePodSandBox"]
    combined = [e for e in failed if e["message"].startswith(COMBINED)]
    assert len(failed) == 10 and len(combined) == 1 and combined[0]["count"] == 3
    assert sum(e["count"] for e in failed) == 12


def test_events_beyond_the_spam_filter_burst_are_dropped() -> None:
    """client-go ``tools/record`` EventSourceObjectSpamFilter: a token bucket per source
    and object, burst 25, refilled one token per 5 minutes; the rest is dropped."""
    clock = [0.0]
    log = _log(clock)
    for i in range(30):
        log.add("Unhealthy", POD, f"Readiness probe failed: {i}", type="Warning", node="n")
    assert sum(e["count"] for e in log.list()) == 25 and log.dropped == 5
    clock[0] = 300.0
    log.add("Unhealthy", POD, "Readiness probe failed: later", type="Warning", node="n")
    assert log.dropped == 5


def test_events_expire_after_the_ttl_and_watchers_see_them_deleted(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """kube-apiserver ``--event-ttl`` (default 1h0m0s: "Amount of time to retain events"),
    https://kubernetes.io/docs/reference/command-line-tools-reference/kube-apiserver/ ; a
    watch of ``/api/v1/namespaces/{ns}/events`` from a list's resourceVersion sees them
    go. The TTL runs on the simulated clock."""
    cluster = make_cluster(nodes=1, mode="manual", event_ttl_s=600.0)
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("p"))
    cluster.run_until_idle()
    listed = core.list_namespaced_event(NS)
    assert listed.items and listed.metadata.resource_version
    assert core.list_event_for_all_namespaces().items
    cluster.advance(601.0)
    resp = core.list_namespaced_event(
        NS,
        watch=True,
        resource_version=listed.metadata.resource_version,
        timeout_seconds=1,
        _preload_content=False,
    )
    kinds = [json.loads(line)["type"] for line in resp.read().splitlines() if line.strip()]
    assert core.list_namespaced_event(NS).items == []
    assert kinds.count("DELETED") == len(listed.items)


def test_events_are_read_only_and_field_selectors_filter_them(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    """Kubernetes API Concepts -- field selectors on Events (``involvedObject.name``),
    https://kubernetes.io/docs/concepts/overview/working-with-objects/field-selectors/ ."""
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("a"))
    core.create_namespaced_pod(NS, pod("b"))
    cluster.run_until_idle()
    only_a = core.list_namespaced_event(
        NS, field_selector="involvedObject.kind=Pod,involvedObject.name=a"
    )
    assert only_a.items and {e.involved_object.name for e in only_a.items} == {"a"}
    body = client.CoreV1Event(
        metadata=client.V1ObjectMeta(name="x"), involved_object=client.V1ObjectReference()
    )
    try:
        core.create_namespaced_event(NS, body)
    except client.ApiException as exc:
        assert exc.status == 405
    else:
        raise AssertionError("the stand-in stored an Event sent by a client")


def test_a_repeated_event_lives_a_ttl_from_its_last_write_and_others_expire_on_time() -> None:
    """kube-apiserver ``--event-ttl``: an Event is kept for the TTL after its LAST write (a
    dedupe bump rewrites it, restarting its lease), so a repeat keeps it while an Event
    written once at the same time goes. The deadlines are kept in a heap: a bump leaves a
    stale entry behind, which must not delete the rewritten Event."""
    clock = [0.0]
    log = _log(clock, ttl_s=100.0)
    other = {**POD, "metadata": {**POD["metadata"], "name": "q", "uid": "u2"}}
    log.add("Pulling", POD, 'Pulling image "x"')
    log.add("Pulling", other, 'Pulling image "x"')
    clock[0] = 60.0
    log.add("Pulling", POD, 'Pulling image "x"')  # the same Event, bumped: lives to 160
    clock[0] = 100.0
    assert log.expire() == 1  # q's, written once at 0
    assert [e["involvedObject"]["name"] for e in log.list()] == ["p"]
    clock[0] = 159.0
    assert log.expire() == 0 and len(log.list()) == 1  # p's stale deadline (100) skipped
    clock[0] = 160.0
    assert log.expire() == 1 and log.list() == []
