"""The ramp as a test (issue 13, item 1; paper §5.2, Table A11): N acquires fired at once
through one controller (200 in CI; 1,000 marked slow), all Ready, on ONE pod watch and
ONE Events watch, then the job's drain leaves 0 pods. The speeds live in
``bench/scale_ramp.py``; here the stand-in runs 10 simulated seconds per wall second and the
job's bucket paces at 200/s.

The stand-in serves list+watch as an API server does ("Efficient detection of changes",
https://kubernetes.io/docs/reference/using-api/api-concepts/#efficient-detection-of-changes):
the informers list once and keep watching from the list's resourceVersion.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from sandboxes import labels as L
from sandboxes.controller import Controller
from sandboxes.models import Job, PendingDelete, Sandbox
from sandboxes.tests.controller_support import acquire_args, make_job
from standin import StandinCluster
from standin.harness.support import NS, k8s_provider, wait_until
from standin.scheduler import AddressModel

N = 1000  # the size; CI runs the ramp at CI_N (below)
CI_N = 200


@pytest.fixture
def cluster() -> Any:
    # 12 nodes x 110 pods: room for 1,000 tiny pods with the spread constraint. Enough
    # spare addresses per node that none fails: address failures are the bench's subject.
    cluster = StandinCluster(
        nodes=12,
        mode="realtime",
        speed=10.0,
        seed=3,
        address_model=AddressModel(warm_addresses=N),
    )
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _loop_load(controller: Controller) -> tuple[int, int]:
    """(tasks, timers) pending on the controller's loop. asyncio has no public count of a
    loop's timers: ``_scheduled`` is its heap of ``TimerHandle``s. A cancelled handle (the
    timeout of an acquire that already returned) stays in that heap until its due time or
    until asyncio compacts the heap (more than 100 cancelled and over half of it): it is
    not a live timer, so it is not counted."""
    loop = controller.loop
    assert loop is not None

    async def count() -> tuple[int, int]:
        scheduled = loop._scheduled  # type: ignore[attr-defined]
        return len(asyncio.all_tasks()), sum(1 for h in scheduled if not h.cancelled())

    return asyncio.run_coroutine_threadsafe(count(), loop).result(timeout=60)


def _managed(cluster: StandinCluster) -> list[str]:
    return [
        p["metadata"]["name"]
        for p in cluster.pods(NS)
        if (p["metadata"].get("labels") or {}).get(L.MANAGED_BY) == L.VALUE_MANAGED_BY
    ]


@pytest.mark.timeout(900)  # a generous bound for a loaded machine, not a timing claim
@pytest.mark.parametrize(
    "n",
    [
        CI_N,
        # 1,000 with the stand-in IN this process did not finish on a shared 2-core machine
        # at load 8-20 (156 acquires timed out at 600 s): it runs with the scale runs.
        pytest.param(N, marks=pytest.mark.slow),
    ],
)
def test_a_ramp_of_acquires_fired_at_once_gets_all_ready_and_drains_to_zero_pods(
    make_controller: Callable[..., Controller], cluster: StandinCluster, n: int
) -> None:
    provider = k8s_provider(
        cluster, verify_health=False, max_workers=16, retry_pending_in_background=True
    )
    controller = make_controller(provider=provider, cluster_rate=400.0, cluster_burst=400)
    job = make_job(
        rate_per_s=200.0, burst=200, max_live=n, max_creating=n, readiness_budget_s=600.0
    )
    spec = {"cpu_millis": 100, "memory_bytes": 128 * 2**20}

    async def burst() -> list[Any]:
        calls = [
            controller.aacquire(**acquire_args(job, timeout_s=600.0, **spec)) for _ in range(n)
        ]
        return await asyncio.gather(*calls, return_exceptions=True)

    idle_before = _loop_load(controller)
    results = asyncio.run(burst())
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == [], errors[:3]
    assert len({r.sandbox_id for r in results}) == n
    assert Sandbox.objects.filter(job=job, state="in_use").count() == n
    assert len(_managed(cluster)) == n
    # One pod watch and one Events watch served the whole ramp: one list each, no relist.
    for informer in (provider.informer, provider.event_informer):
        assert informer is not None
        assert (informer.lists, informer.relists_after_gone) == (1, 0)
    # n pods sit idle in use: no timer and no task per pod on the controller's loop (the
    # pod watch and the periodic rounds are shared; a few transient ones may be in flight).
    tasks, timers = _loop_load(controller)
    assert tasks < idle_before[0] + 10 and timers < idle_before[1] + 10, (idle_before, n)
    stats = controller.stats()["write_batches"]
    assert stats["writes"] >= 6 * n and stats["batches"] < stats["writes"]  # batched

    controller.drain(job_id=job.pk)
    wait_until(
        lambda: Job.objects.get(pk=job.pk).state == "drained",
        what="the job drained",
        deadline_s=300.0,
    )
    wait_until(lambda: not _managed(cluster), what="no Sandman pod left", deadline_s=120.0)
    assert PendingDelete.objects.count() == 0
    assert set(Sandbox.objects.filter(job=job).values_list("state", flat=True)) == {"deleted"}
