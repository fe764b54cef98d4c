"""The stand-in pages lists (``limit``/``continue``) and expires continue tokens.

Imitates "Kubernetes API Concepts -- Retrieving large results sets in chunks",
https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks
(over real HTTP with the official client).
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from standin import StandinCluster
from standin.tests.conftest import NS, pod


def _fill(core: client.CoreV1Api, n: int) -> list[str]:
    names = [f"p-{i:02d}" for i in range(n)]
    for name in reversed(names):  # created out of key order: pages come in key order
        core.create_namespaced_pod(NS, pod(name))
    return names


def test_pages_come_in_key_order_with_continue_and_remaining_count(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    """Each page holds at most ``limit`` items and, while more remain, a ``continue``
    token and ``remainingItemCount``; every page carries the first page's
    ``resourceVersion`` even when objects changed in between (one consistent snapshot)."""
    names = _fill(core, 7)
    first = core.list_namespaced_pod(NS, limit=3)
    assert [p.metadata.name for p in first.items] == names[:3]
    assert first.metadata.remaining_item_count == 4 and first.metadata._continue
    core.create_namespaced_pod(NS, pod("p-05a"))  # after the snapshot: not in this list
    core.delete_namespaced_pod("p-06", NS)
    second = core.list_namespaced_pod(NS, limit=3, _continue=first.metadata._continue)
    third = core.list_namespaced_pod(NS, limit=3, _continue=second.metadata._continue)
    assert [p.metadata.name for p in second.items] == names[3:6]
    assert [p.metadata.name for p in third.items] == names[6:]
    assert third.metadata._continue is None and third.metadata.remaining_item_count is None
    versions = {page.metadata.resource_version for page in (first, second, third)}
    assert versions == {first.metadata.resource_version}
    log = [r.get("query") for r in cluster.requests_log() if r["verb"] == "list"]
    assert log[0] == {"limit": "3"} and log[1]["continue"] == first.metadata._continue


def test_an_unpaged_list_is_unchanged(cluster: StandinCluster, core: client.CoreV1Api) -> None:
    """No ``limit``: every item, no token (the server's default for clients that do not page)."""
    _fill(core, 4)
    listed = core.list_namespaced_pod(NS)
    assert len(listed.items) == 4 and listed.metadata._continue is None


def test_a_compacted_continue_token_is_410_expired_with_a_fresh_token(
    cluster: StandinCluster, core: client.CoreV1Api
) -> None:
    """A token older than the compacted version answers 410 ``Expired`` ("The provided
    continue parameter is too old ...") with a fresh token in the Status's metadata that
    resumes after the same key, inconsistently, against the current state."""
    names = _fill(core, 5)
    first = core.list_namespaced_pod(NS, limit=2)
    core.create_namespaced_pod(NS, pod("p-03a"))
    cluster.compact_history()
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod(NS, limit=2, _continue=first.metadata._continue)
    assert caught.value.status == 410
    body = json.loads(caught.value.body)
    assert body["reason"] == "Expired" and body["code"] == 410
    assert body["message"].startswith("The provided continue parameter is too old")
    fresh = body["metadata"]["continue"]
    rest = core.list_namespaced_pod(NS, limit=10, _continue=fresh)
    assert [p.metadata.name for p in rest.items] == [names[2], names[3], "p-03a", names[4]]


def test_a_garbled_continue_token_is_a_400(core: client.CoreV1Api) -> None:
    with pytest.raises(ApiException) as caught:
        core.list_namespaced_pod(NS, limit=2, _continue="not-a-token")
    assert caught.value.status == 400
