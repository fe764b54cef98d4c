"""The stand-in speaks the pod/ConfigMap API subset the official client uses (real HTTP)."""

from __future__ import annotations

import json
import queue
import threading
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from standin import StandinCluster
from standin.tests.conftest import NS, core_for, pod


def test_create_fills_server_metadata_and_pending_status(core: client.CoreV1Api) -> None:
    created = core.create_namespaced_pod(NS, pod("a"))
    again = core.create_namespaced_pod(NS, pod("b"))
    assert created.metadata.uid and created.metadata.uid != again.metadata.uid
    assert int(again.metadata.resource_version) > int(created.metadata.resource_version)
    assert created.metadata.creation_timestamp is not None
    assert created.metadata.namespace == NS
    assert created.status.phase == "Pending"
    assert created.status.qos_class == "Guaranteed"


def test_missing_pod_is_a_404_status(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_pod("nope", NS)
    assert caught.value.status == 404
    body = json.loads(caught.value.body)
    assert body["kind"] == "Status" and body["reason"] == "NotFound" and body["code"] == 404


def test_second_create_with_the_same_name_is_a_409(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod("dup"))
    with pytest.raises(ApiException) as caught:
        core.create_namespaced_pod(NS, pod("dup"))
    assert caught.value.status == 409
    assert json.loads(caught.value.body)["reason"] == "AlreadyExists"


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("app=x", {"p1", "p2"}),
        ("app==x,tier=web", {"p1"}),
        ("app!=x", {"p3", "p4"}),
        ("tier in (web, db)", {"p1", "p2", "p3"}),
        ("tier notin (web)", {"p2", "p3", "p4"}),
        ("tier", {"p1", "p2", "p3"}),
        ("!tier", {"p4"}),
    ],
)
def test_list_honours_label_selectors(
    core: client.CoreV1Api, selector: str, expected: set[str]
) -> None:
    core.create_namespaced_pod(NS, pod("p1", labels={"app": "x", "tier": "web"}))
    core.create_namespaced_pod(NS, pod("p2", labels={"app": "x", "tier": "db"}))
    core.create_namespaced_pod(NS, pod("p3", labels={"app": "y", "tier": "db"}))
    core.create_namespaced_pod(NS, pod("p4", labels={"app": "y"}))
    core.create_namespaced_pod("other", pod("p5", labels={"app": "x"}))
    listed = core.list_namespaced_pod(NS, label_selector=selector)
    assert {p.metadata.name for p in listed.items} == expected
    assert int(listed.metadata.resource_version) >= 5


def test_bad_selector_is_a_400(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod(NS, label_selector="a in b")
    assert caught.value.status == 400


def _stream_into(
    q: queue.Queue[Any], w: watch.Watch, fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> threading.Thread:
    def run() -> None:
        try:
            for event in w.stream(fn, *args, **kwargs):
                q.put(event)
        except Exception as exc:  # delivered to the test thread
            q.put(exc)
        q.put(None)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_watch_resumes_from_a_resource_version(make_cluster: Callable[..., StandinCluster]) -> None:
    """Events after the list's version, in order; the selector applies to the watch."""
    cluster = make_cluster(nodes=1, mode="manual")  # no kubelet changes in between
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("before", labels={"w": "1"}))
    version = core.list_namespaced_pod(NS, label_selector="w=1").metadata.resource_version
    core.create_namespaced_pod(NS, pod("after", labels={"w": "1"}))
    core.create_namespaced_pod(NS, pod("unlabelled"))
    events: queue.Queue[Any] = queue.Queue()
    w = watch.Watch()
    thread = _stream_into(
        events,
        w,
        core.list_namespaced_pod,
        NS,
        label_selector="w=1",
        resource_version=version,
        timeout_seconds=30,
    )
    try:
        first = events.get(timeout=10)
        assert (first["type"], first["object"].metadata.name) == ("ADDED", "after")
        core.delete_namespaced_pod("before", NS)
        seen = events.get(timeout=10)
        assert (seen["type"], seen["object"].metadata.name) == ("DELETED", "before")
    finally:
        w.stop()
        thread.join(timeout=10)


def test_watch_from_a_forgotten_version_gets_410(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    core.create_namespaced_pod(NS, pod("a"))
    old = core.list_namespaced_pod(NS).metadata.resource_version
    core.create_namespaced_pod(NS, pod("b"))
    cluster.compact_history()
    with pytest.raises(ApiException) as caught:
        for _ in watch.Watch().stream(
            core.list_namespaced_pod, NS, resource_version=old, timeout_seconds=5
        ):
            pass
    assert caught.value.status == 410


def test_watch_410_can_be_an_http_status(make_cluster: Callable[..., StandinCluster]) -> None:
    cluster = make_cluster(nodes=1, gone_mode="http")
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("a"))
    cluster.compact_history()
    with pytest.raises(ApiException) as caught:
        for _ in watch.Watch().stream(
            core.list_namespaced_pod, NS, resource_version="1", timeout_seconds=5
        ):
            pass
    assert caught.value.status == 410


def test_watch_sends_bookmarks_only_when_allowed(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    events: queue.Queue[Any] = queue.Queue()
    plain: queue.Queue[Any] = queue.Queue()
    w, w_plain = watch.Watch(), watch.Watch()
    version = core.list_namespaced_pod(NS).metadata.resource_version
    threads = [
        _stream_into(
            events,
            w,
            core.list_namespaced_pod,
            NS,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=30,
        ),
        _stream_into(
            plain,
            w_plain,
            core.list_namespaced_pod,
            NS,
            resource_version=version,
            timeout_seconds=30,
        ),
    ]
    try:
        assert cluster.wait_for_watchers(2, timeout=10)
        assert cluster.bookmark() == 1
        event = events.get(timeout=10)
        assert event["type"] == "BOOKMARK"
        assert w.resource_version == version
        core.create_namespaced_pod(NS, pod("x"))
        assert plain.get(timeout=10)["type"] == "ADDED"  # the first thing the plain watch saw
    finally:
        w.stop()
        w_plain.stop()
        for thread in threads:
            thread.join(timeout=10)


def test_watch_honours_timeout_seconds_and_client_disconnects(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    ended = list(
        watch.Watch().stream(core.list_namespaced_pod, NS, resource_version="0", timeout_seconds=1)
    )
    assert ended == []
    events: queue.Queue[Any] = queue.Queue()
    w = watch.Watch()
    thread = _stream_into(events, w, core.list_namespaced_pod, NS, timeout_seconds=60)
    core.create_namespaced_pod(NS, pod("before-disconnect"))
    assert events.get(timeout=10)["type"] == "ADDED"  # the stream is flowing
    w.stop()  # the client hangs up mid-stream
    thread.join(timeout=10)
    assert not thread.is_alive()
    core.create_namespaced_pod(NS, pod("after-disconnect"))  # the server noticed and goes on
    assert cluster.wait_for_watchers(0, timeout=10, exact=True)


@pytest.mark.parametrize(
    "content_type",
    ["application/merge-patch+json", "application/strategic-merge-patch+json", None],
)
def test_patch_merges_labels_and_bumps_the_version(
    core: client.CoreV1Api, content_type: str | None
) -> None:
    created = core.create_namespaced_pod(NS, pod("p", labels={"keep": "1", "drop": "1"}))
    kwargs = {"_content_type": content_type} if content_type else {}
    patched = core.patch_namespaced_pod(
        "p", NS, {"metadata": {"labels": {"new": "2", "drop": None}}}, **kwargs
    )
    assert patched.metadata.labels == {"keep": "1", "new": "2"}
    assert patched.metadata.uid == created.metadata.uid
    assert int(patched.metadata.resource_version) > int(created.metadata.resource_version)


def test_json_patch_list_is_applied(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NS, pod("p", labels={"a": "1"}))
    patched = core.patch_namespaced_pod(
        "p", NS, [{"op": "add", "path": "/metadata/labels/b", "value": "2"}]
    )
    assert patched.metadata.labels == {"a": "1", "b": "2"}


def test_delete_honours_the_uid_precondition(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    created = core.create_namespaced_pod(NS, pod("p"))
    wrong = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid="not-the-uid"))
    with pytest.raises(ApiException) as caught:
        core.delete_namespaced_pod("p", NS, body=wrong)
    assert caught.value.status == 409
    assert cluster.pod(NS, "p") is not None
    right = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=created.metadata.uid))
    core.delete_namespaced_pod("p", NS, body=right)
    assert cluster.pod(NS, "p") is None
    with pytest.raises(ApiException) as caught:
        core.delete_namespaced_pod("p", NS)
    assert caught.value.status == 404


def test_configmaps_create_get_list_delete(core: client.CoreV1Api) -> None:
    body = client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name="anchor", labels={"job": "1"}), data={"k": "v"}
    )
    created = core.create_namespaced_config_map(NS, body)
    assert core.read_namespaced_config_map("anchor", NS).metadata.uid == created.metadata.uid
    assert [
        c.metadata.name for c in core.list_namespaced_config_map(NS, label_selector="job=1").items
    ] == ["anchor"]
    core.delete_namespaced_config_map("anchor", NS)
    with pytest.raises(ApiException) as caught:
        core.read_namespaced_config_map("anchor", NS)
    assert caught.value.status == 404


def test_deleting_an_anchor_garbage_collects_the_pods_it_owns(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    anchor = core.create_namespaced_config_map(
        NS, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="anchor"))
    )
    core.create_namespaced_pod(NS, pod("owned", owner=("ConfigMap", "anchor", anchor.metadata.uid)))
    core.create_namespaced_pod(NS, pod("free"))
    cluster.run_until_idle()
    assert {p["metadata"]["name"] for p in cluster.pods(NS)} == {"owned", "free"}
    core.delete_namespaced_config_map("anchor", NS)
    cluster.run_until_idle()
    assert [p["metadata"]["name"] for p in cluster.pods(NS)] == ["free"]
    gc = [e for e in cluster.events() if e["reason"] == "GarbageCollected"]
    assert [e["involvedObject"]["name"] for e in gc] == ["owned"]


def test_a_pod_whose_owner_never_existed_is_garbage_collected(
    make_cluster: Callable[..., StandinCluster],
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    core = core_for(cluster)
    core.create_namespaced_pod(NS, pod("orphan", owner=("Pod", "trainer", "no-such-uid")))
    cluster.run_until_idle()
    assert cluster.pods(NS) == []


def test_plans_change_create_answers(cluster: StandinCluster, core: client.CoreV1Api) -> None:
    cluster.plans.add("create", "403", name_prefix="forbidden")
    cluster.plans.add("create", "500_before_store", name_prefix="broken")
    cluster.plans.add("create", "504_after_store", name_prefix="slow")
    cluster.plans.add("create", "reset_after_store", name_prefix="reset")
    for name, status in [("forbidden", 403), ("broken", 500), ("slow", 504)]:
        with pytest.raises(ApiException) as caught:
            core.create_namespaced_pod(NS, pod(name))
        assert caught.value.status == status
        assert json.loads(caught.value.body)["code"] == status
    with pytest.raises(urllib3.exceptions.ProtocolError):
        core.create_namespaced_pod(NS, pod("reset"))
    assert {p["metadata"]["name"] for p in cluster.pods(NS)} == {"slow", "reset"}
    core.create_namespaced_pod(NS, pod("forbidden"))  # one-shot: the plan is spent


def test_plans_change_delete_answers(cluster: StandinCluster, core: client.CoreV1Api) -> None:
    for name in ("d500", "dlost", "dhang", "dhang-applied"):
        core.create_namespaced_pod(NS, pod(name))
    cluster.plans.add("delete", "500_not_applied", name_prefix="d500")
    cluster.plans.add("delete", "reset_after_apply", name_prefix="dlost")
    cluster.plans.add(
        "delete", "hang_not_applied", name_prefix="dhang", predicate=lambda n, _: n == "dhang"
    )
    cluster.plans.add("delete", "hang_after_apply", name_prefix="dhang-applied")
    with pytest.raises(ApiException) as caught:
        core.delete_namespaced_pod("d500", NS)
    assert caught.value.status == 500
    with pytest.raises(urllib3.exceptions.ProtocolError):
        core.delete_namespaced_pod("dlost", NS)
    for name in ("dhang", "dhang-applied"):
        with pytest.raises(urllib3.exceptions.ReadTimeoutError):
            core.delete_namespaced_pod(name, NS, _request_timeout=0.3)
    assert {p["metadata"]["name"] for p in cluster.pods(NS)} == {"d500", "dhang"}


def test_gate_holds_a_create_before_it_is_stored(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    gate = cluster.gates.add("create_received", name="held")
    done = threading.Event()
    thread = threading.Thread(
        target=lambda: (core.create_namespaced_pod(NS, pod("held")), done.set())
    )
    thread.start()
    try:
        ctx = gate.wait_reached(timeout=10)
        assert ctx.name == "held" and ctx.verb == "create"
        assert cluster.pods(NS) == [] and not done.is_set()
    finally:
        gate.release()
        thread.join(timeout=10)
    assert done.is_set() and cluster.pod(NS, "held") is not None


def test_gate_holds_the_answer_of_a_stored_create(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    gate = cluster.gates.add("create_stored", name_prefix="held")
    done = threading.Event()
    thread = threading.Thread(
        target=lambda: (core.create_namespaced_pod(NS, pod("held-1")), done.set())
    )
    thread.start()
    try:
        gate.wait_reached(timeout=10)
        assert cluster.pod(NS, "held-1") is not None and not done.is_set()
    finally:
        gate.release()
        thread.join(timeout=10)
    assert done.is_set()


def test_control_routes_dump_state_and_add_plans(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    core.create_namespaced_pod(NS, pod("a"))
    request = urllib.request.Request(
        cluster.url + "/_standin/plans",
        method="POST",
        data=json.dumps({"verb": "create", "action": "403", "name_prefix": "b"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 201
    with pytest.raises(ApiException):
        core.create_namespaced_pod(NS, pod("b"))
    with urllib.request.urlopen(cluster.url + "/_standin/state", timeout=10) as resp:
        state = json.load(resp)
    assert [p["metadata"]["name"] for p in state["pods"]] == ["a"]
    assert len(state["nodes"]) == 3 and "total" in state["address_failures"]
    assert state["requests"]["create pods"] == 2


def test_kubeconfig_points_the_client_at_the_standin(
    cluster: StandinCluster, tmp_path: Any
) -> None:
    from kubernetes import config as kube_config

    path = cluster.write_kubeconfig(tmp_path / "kubeconfig", namespace=NS)
    configuration = client.Configuration()
    kube_config.load_kube_config(config_file=str(path), client_configuration=configuration)
    api = client.CoreV1Api(client.ApiClient(configuration))
    api.create_namespaced_pod(NS, pod("via-kubeconfig"))
    assert [p.metadata.name for p in api.list_namespaced_pod(NS).items] == ["via-kubeconfig"]
    api.api_client.close()
