"""Deleting pods that stay Terminating for their grace period (real HTTP, manual clock).

The stand-in deletes gracefully as a real API server and kubelet do ("Pod Lifecycle --
Termination of Pods", https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/
#pod-termination): a DELETE answers 200 with the pod Terminating and the pod goes only when
its kubelet has stopped it (a DELETED watch event). So a 2xx is not a confirmation: the
provider confirms a delete at the DELETED event (or a 404 read), never DELETEs a
Terminating pod again, and reports Terminating pods in ``list_owned``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from sandboxes.providers.base import Handle
from sandboxes.providers.kubernetes import KubernetesProvider, PendingDelete
from sandboxes.tests.providers.conftest import NS, spec
from sandman_site.errors import ProviderError
from standin import StandinCluster

MakeCluster = Callable[..., StandinCluster]
MakeProvider = Callable[..., KubernetesProvider]
GRACE = 5  # KubernetesConfig.termination_grace_s: the pods' terminationGracePeriodSeconds


def deletes(cluster: StandinCluster) -> int:
    return cluster.request_counts()[("delete", "pods")]


async def _running(cluster: StandinCluster, provider: KubernetesProvider, n: int) -> list[Handle]:
    handles = [await provider.create(spec(f"sb-{i}")) for i in range(n)]
    cluster.advance(10)  # scheduled and started: each has a kubelet that must stop it
    assert all(p["spec"].get("nodeName") for p in cluster.pods(NS))
    return handles


@pytest.mark.asyncio
async def test_a_delete_is_confirmed_only_when_the_pod_is_gone(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """Churn on the simulated clock: every pod Terminating at once, one DELETE each,
    each confirmed only after the stand-in removed it."""
    cluster = make_cluster(nodes=2, mode="manual")
    confirmed: list[tuple[str, bool]] = []
    pending: set[str] = set()
    handles: list[Handle] = []

    def on_pending(entry: PendingDelete) -> None:
        pending.add(entry.name)
        if len(pending) == len(handles):  # every pod Terminating: let the kubelets finish
            cluster.advance(GRACE)

    def on_deleted(name: str, uid: str) -> None:
        confirmed.append((name, cluster.pod(NS, name) is None))

    provider = make_provider(cluster, on_pending=on_pending, on_deleted=on_deleted)
    handles.extend(await _running(cluster, provider, 6))
    await asyncio.gather(*(provider.destroy(h) for h in handles))
    assert cluster.pods(NS) == []
    assert sorted(confirmed) == sorted((h.name, True) for h in handles)
    assert deletes(cluster) == len(handles)
    assert provider.pending_deletes() == []


@pytest.mark.asyncio
async def test_a_terminating_pod_is_not_deleted_again_and_is_listed_as_terminating(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """A pod on a partitioned node stays Terminating past its grace period: a second
    destroy, the pending retries and a listing send no second DELETE."""
    cluster = make_cluster(nodes=1, mode="manual")
    provider = make_provider(cluster, destroy_attempts=1, delete_confirm_s=0.0)
    (handle,) = await _running(cluster, provider, 1)
    cluster.partition_node("node-0")
    with pytest.raises(ProviderError):  # not confirmed: kept pending
        await provider.destroy(handle)
    cluster.advance(120)
    assert cluster.pod(NS, handle.name) is not None
    (owned,) = await provider.list_owned()
    assert owned.terminating  # type: ignore[attr-defined]
    with pytest.raises(ProviderError):
        await provider.destroy(handle)
    assert await provider.flush_pending() == 0
    assert deletes(cluster) == 1
    assert [p.name for p in provider.pending_deletes()] == [handle.name]
    cluster.heal_node("node-0")
    cluster.advance(0)
    await provider.flush_pending()  # a 404 read, unless the DELETED event confirmed it first
    assert provider.pending_deletes() == [] and deletes(cluster) == 1
