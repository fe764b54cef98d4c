"""A create the API server stores after it answered 504 (or dropped the connection).

The stand-in's ``*_store_later`` plans commit the pod ``delay_s`` simulated seconds after
the failed answer, as kube-apiserver can once a request has outlived its
``--request-timeout`` (https://kubernetes.io/docs/reference/command-line-tools-reference/
kube-apiserver/). The provider's read-back then finds nothing; it must keep watching for
the create's nonce (its informer sees every pod with Sandman's labels) until the name is
proven absent past the server's request timeout, and delete the pod when it lands --
never a pod with another nonce that took the name meanwhile (paper Appendix F).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sandboxes import labels as L
from sandboxes.providers.kubernetes import KubernetesConfig, KubernetesProvider, LateCreates
from sandboxes.tests.providers.conftest import NS, spec
from sandman_site.errors import ProviderAmbiguous
from standin import StandinCluster

MakeCluster = Callable[..., StandinCluster]
MakeProvider = Callable[..., KubernetesProvider]


@pytest.mark.asyncio
@pytest.mark.parametrize("action", ["504_store_later", "reset_store_later"])
async def test_a_create_that_lands_after_its_read_back_is_deleted_when_it_lands(
    make_cluster: MakeCluster, make_provider: MakeProvider, action: str
) -> None:
    cluster = make_cluster(nodes=1, mode="manual")
    confirmed = asyncio.Event()
    deleted: list[str] = []

    def on_deleted(name: str, uid: str) -> None:
        deleted.append(name)
        confirmed.set()

    provider = make_provider(cluster, on_deleted=on_deleted)
    cluster.plans.add("create", action, name_prefix="sb-", delay_s=3.0, times=2)
    for name in ("sb-1", "sb-2"):
        with pytest.raises(ProviderAmbiguous) as caught:
            await provider.create(spec(name))
        assert caught.value.extra["stored"] is False
    # Another workload takes the name sb-2 first: the late write of sb-2 then fails.
    foreign = {
        "metadata": {
            "name": "sb-2",
            "labels": {L.MANAGED_BY: L.VALUE_MANAGED_BY},
            "annotations": {L.NONCE_ANNOTATION: "someone-else"},
        },
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    }
    cluster.put_pod(NS, foreign)
    cluster.advance(3)  # the API server commits the timed-out write of sb-1
    await asyncio.wait_for(confirmed.wait(), 30)
    assert deleted == ["sb-1"] and provider.pending_deletes() == []
    assert [p["metadata"]["name"] for p in cluster.pods(NS)] == ["sb-2"]  # left alone
    assert cluster.request_counts()[("delete", "pods")] == 1


def _pod(name: str, nonce: str, uid: str = "uid-1") -> dict[str, object]:
    return {"metadata": {"name": name, "uid": uid, "annotations": {L.NONCE_ANNOTATION: nonce}}}


def test_an_expectation_ends_once_the_server_could_no_longer_commit_the_create() -> None:
    """Past ``server_request_timeout_s`` (plus the client's timeout for the watch to deliver)
    from the send, the name is proven absent: a pod landing later is not ours to delete."""
    now = [100.0]
    landed: list[tuple[str, str, str]] = []
    config = KubernetesConfig(server_request_timeout_s=60.0, request_timeout_s=30.0)
    late = LateCreates(config, on_landed=lambda *p: landed.append(p), clock=lambda: now[0])
    late.expect("sb-1", "n-1", since=100.0)
    late.expect("sb-2", "n-2", since=100.0)
    late.on_event("ADDED", _pod("sb-1", "someone-else"))  # the name, not our nonce
    now[0] = 189.0
    late.on_event("ADDED", _pod("sb-1", "n-1"))
    assert landed == [("sb-1", "uid-1", "n-1")] and late.expected() == ["sb-2"]
    now[0] = 190.5
    late.on_sync([], 190.5, "9")
    assert late.expected() == []
    late.on_event("ADDED", _pod("sb-2", "n-2", uid="uid-2"))
    assert landed == [("sb-1", "uid-1", "n-1")]


def test_a_pod_that_landed_before_its_create_was_expected_is_still_found() -> None:
    landed: list[tuple[str, str, str]] = []
    late = LateCreates(KubernetesConfig(), on_landed=lambda *p: landed.append(p))
    late.on_event("ADDED", _pod("sb-1", "n-1"))  # the informer was quicker than the creator
    late.expect("sb-1", "n-1", since=10.0**9)
    assert landed == [("sb-1", "uid-1", "n-1")] and late.expected() == []
