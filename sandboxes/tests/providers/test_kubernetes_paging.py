"""The provider lists in pages (``limit``/``continue``) against the stand-in (issue 9, item 5).

Real HTTP with the official client, unpatched; the stand-in's request log is the auditor:
every list request carries the chosen page size, a token expired mid-list restarts the
list, and nothing is missed or duplicated.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest

from sandboxes import labels as L
from sandboxes.providers.kubernetes import KubernetesProvider
from sandboxes.tests.providers.conftest import NS, spec
from standin import StandinCluster
from standin.gates import GateContext

MakeCluster = Callable[..., StandinCluster]
MakeProvider = Callable[..., KubernetesProvider]


def put_sandman_pod(cluster: StandinCluster, name: str) -> None:
    cluster.put_pod(
        NS,
        {
            "metadata": {
                "name": name,
                "labels": {L.MANAGED_BY: L.VALUE_MANAGED_BY, L.JOB: "7", L.ROLE: "rollout"},
                "annotations": {L.NONCE_ANNOTATION: f"nonce-{name}"},
            },
            "spec": {"containers": [{"name": "sandbox", "image": "task/img:1"}]},
        },
    )


def list_queries(cluster: StandinCluster) -> list[dict[str, str]]:
    """The pod lists (the Events informer lists events on its own)."""
    log = cluster.requests_log()
    return [r.get("query") or {} for r in log if r["verb"] == "list" and r["resource"] == "pods"]


@pytest.mark.asyncio
async def test_lists_come_in_pages_of_the_chosen_size_and_miss_nothing(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=2)
    for i in range(12):
        put_sandman_pod(cluster, f"old-{i:02d}")
    provider = make_provider(cluster, list_page_size=5)
    await provider.wait_ready(await provider.create(spec("mine")), 30)  # the informer synced
    owned = await provider.list_owned()
    names = [o.name for o in owned]
    assert sorted(names) == sorted([f"old-{i:02d}" for i in range(12)] + ["mine"])
    assert len(set(names)) == len(names) == 13
    queries = list_queries(cluster)
    assert len(queries) == 6  # 13 pods in pages of 5: three for the informer, three here
    assert all(q.get("limit") == "5" for q in queries)
    assert sum("continue" in q for q in queries) == 4


@pytest.mark.asyncio
async def test_a_continue_token_expired_mid_list_restarts_it(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=2)
    for i in range(7):
        put_sandman_pod(cluster, f"old-{i:02d}")
    provider = make_provider(cluster, list_page_size=5)
    await provider.wait_ready(await provider.create(spec("mine")), 30)  # the informer synced
    before = len(list_queries(cluster))
    seen = itertools.count()

    def second_page(ctx: GateContext) -> bool:
        return next(seen) == 1  # the lister's second request: its first continue

    gate = cluster.gates.add("list_received", second_page)
    listing = asyncio.ensure_future(provider.list_owned())
    await gate.reached(timeout=10)
    put_sandman_pod(cluster, "late")  # arrives between the pages ...
    cluster.compact_history()  # ... and the first page's snapshot is compacted away
    gate.release()
    names = [o.name for o in await listing]
    assert sorted(names) == sorted([f"old-{i:02d}" for i in range(7)] + ["mine", "late"])
    assert len(set(names)) == len(names)
    queries = list_queries(cluster)[before:]
    assert len(queries) == 4  # page 1, page 2 (410), then the list again from the start
    assert "continue" not in queries[0] and "continue" in queries[1]
    assert "continue" not in queries[2] and "continue" in queries[3]
