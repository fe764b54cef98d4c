"""The provider against an API server that sheds load and refuses creates (issue 9, items 4, 9).

Real HTTP to the stand-in with the official client, unpatched. The stand-in's request
counts are the auditor: "no relist after a 429 or a dropped watch; one relist after a
410", "a 429 create is resent with the same name and nonce, no DELETE".
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest

from sandboxes import labels as L
from sandboxes.providers.kubernetes import KubernetesProvider
from sandboxes.tests.providers.conftest import NS, spec
from sandman_site.errors import ProviderAmbiguous, ProviderError
from standin import StandinCluster
from standin.admission import PodQuota

MakeCluster = Callable[..., StandinCluster]
MakeProvider = Callable[..., KubernetesProvider]
READY_S = 30.0


def counts(cluster: StandinCluster, verb: str) -> int:
    return cluster.request_counts()[(verb, "pods")]


class RecordedSleep:
    """The provider's injected sleep: records each backoff; readiness budgets really wait."""

    def __init__(self, on_first: Callable[[], object] | None = None) -> None:
        self.waits: list[float] = []
        self._on_first = on_first

    async def __call__(self, seconds: float) -> None:
        if seconds >= READY_S:  # a readiness budget: the pod's Ready event ends it first
            await asyncio.sleep(seconds)
            return
        self.waits.append(seconds)
        if len(self.waits) == 1 and self._on_first is not None:
            self._on_first()


# --- item 4: load shedding ---------------------------------------------------------------------
@pytest.mark.asyncio
async def test_a_429_create_is_resent_with_the_same_name_and_nonce_and_becomes_ready(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    sleep = RecordedSleep()
    provider = make_provider(cluster, sleep=sleep)
    cluster.plans.add("create", "429", name_prefix="sb-", retry_after_s=2)
    handle = await provider.create(spec("sb-1"))
    info = await provider.wait_ready(handle, READY_S)
    assert info.address
    assert sleep.waits == [2.0]  # Retry-After honoured, once
    creates = [r["name"] for r in cluster.requests_log() if r["verb"] == "create"]
    assert [name for name in creates if name.startswith("sb-")] == ["sb-1", "sb-1"]
    pod = cluster.pod(NS, "sb-1")
    assert pod["metadata"]["annotations"][L.NONCE_ANNOTATION] == "nonce-sb-1"
    assert counts(cluster, "delete") == 0 and counts(cluster, "get") == 0


@pytest.mark.asyncio
async def test_a_429_on_the_jobs_secret_is_resent_after_retry_after_and_the_pod_starts(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    """API Priority and Fairness sheds any request, the job's Secret create included
    (https://kubernetes.io/docs/concepts/cluster-administration/flow-control/): creating it
    is idempotent (409 means it exists), so it is sent again after its Retry-After."""
    cluster = make_cluster(nodes=1)
    sleep = RecordedSleep()
    provider = make_provider(cluster, sleep=sleep)
    cluster.plans.add("create", "429", resource="secrets", retry_after_s=3)
    handle = await provider.create(spec("sb-1"))
    info = await provider.wait_ready(handle, READY_S)
    assert info.address
    assert sleep.waits == [3.0]
    creates = [r["name"] for r in cluster.requests_log() if r["verb"] == "create"]
    assert len([name for name in creates if name.startswith("sandman-job-")]) == 2
    assert [name for name in creates if name.startswith("sb-")] == ["sb-1"]


@pytest.mark.asyncio
async def test_a_429_create_past_its_attempts_fails_without_a_read_or_delete(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster, sleep=RecordedSleep(), throttle_attempts=2)
    cluster.plans.add("create", "429", name_prefix="sb-", times=None)
    with pytest.raises(ProviderError) as caught:
        await provider.create(spec("sb-1"))
    assert caught.value.extra["status"] == 429
    assert counts(cluster, "get") == 0 and counts(cluster, "delete") == 0
    assert cluster.pods(NS) == []


@pytest.mark.asyncio
async def test_a_throttled_watch_rewatches_from_its_last_version_without_relisting(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=2)
    provider = make_provider(cluster, backoff_initial_s=0.0)
    await provider.wait_ready(await provider.create(spec("a")), READY_S)
    plan = cluster.plans.add("watch", "429", retry_after_s=1)
    cluster.close_watches()  # the informer re-watches, is shed, waits, re-watches
    info = await provider.wait_ready(await provider.create(spec("b")), READY_S)
    assert info.address and plan.fired == 1
    assert counts(cluster, "list") == 1 and counts(cluster, "watch") == 3
    informer = provider.informer
    assert informer is not None and informer.relists_after_gone == 0
    assert informer.retry_after_waits == [1.0]


@pytest.mark.asyncio
async def test_a_dropped_watch_rewatches_and_only_a_410_relists(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=2)
    provider = make_provider(cluster, backoff_initial_s=0.0)
    await provider.wait_ready(await provider.create(spec("a")), READY_S)
    plan = cluster.plans.add("watch", "drop")
    watches = itertools.count()
    rewatch = cluster.gates.add("watch_received", lambda ctx: next(watches) == 1)
    cluster.close_watches()  # re-watch -> the connection breaks -> re-watch again
    await rewatch.reached(timeout=10)  # the watch after the broken one was sent
    assert plan.fired == 1
    assert counts(cluster, "list") == 1 and counts(cluster, "watch") == 3
    rewatch.release()
    await provider.wait_ready(await provider.create(spec("b")), READY_S)
    gate = cluster.gates.add("watch_received")
    cluster.close_watches()
    await gate.reached(timeout=10)  # held while history moves on and is compacted
    c = await provider.create(spec("c"))
    cluster.compact_history()
    gate.release()
    await provider.wait_ready(c, READY_S)
    assert counts(cluster, "list") == 2  # exactly one relist, after the 410
    assert provider.informer is not None and provider.informer.relists_after_gone == 1


# --- item 9: errors told apart -----------------------------------------------------------------
@pytest.mark.asyncio
async def test_a_422_is_final_and_names_the_field(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster, sleep=RecordedSleep())
    with pytest.raises(ProviderError) as caught:
        await provider.create(spec("sb-1", image=""))
    error = caught.value
    assert error.status == 422 and error.code == "provider_invalid"
    assert "spec.containers[0].image" in str(error)
    assert error.extra["fields"] == ["spec.containers[0].image"]
    assert counts(cluster, "create") == 1  # final: never resent
    assert counts(cluster, "get") == 0 and counts(cluster, "delete") == 0


@pytest.mark.asyncio
async def test_an_exceeded_quota_403_backs_off_and_is_retried(
    make_cluster: MakeCluster, make_provider: MakeProvider
) -> None:
    cluster = make_cluster(nodes=1)
    cluster.api.quotas[NS] = PodQuota("sandbox-quota", pods=0)
    sleep = RecordedSleep(on_first=lambda: cluster.api.quotas.clear())  # quota freed
    provider = make_provider(cluster, sleep=sleep)
    handle = await provider.create(spec("sb-1"))
    assert (await provider.wait_ready(handle, READY_S)).address
    assert len(sleep.waits) == 1
    assert counts(cluster, "create") == 2 and counts(cluster, "delete") == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("plan", ["500_before_store", "webhook_timeout", "504_after_store"])
async def test_a_5xx_create_keeps_its_status_for_the_create_error_detector(
    make_cluster: MakeCluster, make_provider: MakeProvider, plan: str
) -> None:
    """A webhook timeout and a 500 are ambiguous like any 5xx: read back, delete our own."""
    cluster = make_cluster(nodes=1)
    provider = make_provider(cluster)
    cluster.plans.add("create", plan, name_prefix="sb-")
    with pytest.raises(ProviderAmbiguous) as caught:
        await provider.create(spec("sb-1"))
    assert caught.value.extra["status"] == (504 if plan == "504_after_store" else 500)
    assert caught.value.extra["stored"] is (plan == "504_after_store")
    assert cluster.pods(NS) == []
