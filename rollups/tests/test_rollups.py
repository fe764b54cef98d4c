"""Rollup reads give the raw queries' numbers: counts exactly, percentiles within the bins'
stated error, on hand-built rows with a bucket boundary, late rows and a row moved across
a boundary (issue 11 item 6). PostgreSQL only: the rollups exist only there."""

from __future__ import annotations

import datetime as dt
import os

import pytest

from dashboards.filters import ChartFilter
from dashboards.selectors import operations, overview, rolled
from dashboards.tests.factories import T0, acquisition, make_job, sandbox
from dashboards.window import window_between
from rollups import bins
from rollups.models import BUCKET_S, ReadyRollup, RollupDirty, RollupState
from rollups.plan import Plan, window_plan
from rollups.refresh import rollups_refresh
from sandboxes.models import Acquisition, Sandbox

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL", "").startswith("postgres"),
        reason="rollups are PostgreSQL's",
    ),
]

# A day ending 13 min after T0 (12:00 UTC, a bucket start): 30-minute chart buckets, a
# partial bucket at each edge.
SINCE = T0 - dt.timedelta(hours=23, minutes=47)
UNTIL = T0 + dt.timedelta(minutes=13)
LATER = T0 + dt.timedelta(hours=3)
US = dt.timedelta(microseconds=1)


def _flt(**kw: object) -> ChartFilter:
    return ChartFilter(window=window_between(since=SINCE, until=UNTIL), **kw)  # type: ignore[arg-type]


def _seed() -> tuple[int, int]:
    busy, quiet = make_job("busy"), make_job("quiet")
    rows = []
    times = [T0 - US, T0, T0 + US, SINCE + US, UNTIL - US, T0 - dt.timedelta(hours=5)]
    for i in range(60):
        base = times[i % len(times)] - dt.timedelta(minutes=(i * 7) % 50)
        job = busy if i % 3 else quiet
        row = sandbox(
            job,
            requested_at=base,
            ready_after_ms=900 + 37 * i,
            image_present=(None, True, False)[i % 3],
            node=f"node-{i % 4}" if i % 5 else "",
            address_failures=(None, 0, 2)[i % 3],
            scheduled_at=base + dt.timedelta(seconds=i % 9) if i % 2 else None,
            source=("", "warm", "created")[i % 3],
        )
        row.backend = "kubernetes" if i % 4 else "local"
        rows.append(row)
    # A burst in one second, and a create exactly on the boundary.
    rows += [sandbox(busy, requested_at=T0 + dt.timedelta(milliseconds=j)) for j in range(5)]
    made = Sandbox.objects.bulk_create(rows)
    Acquisition.objects.bulk_create(
        [
            acquisition(
                busy if i % 2 else quiet,
                finished_at=times[i % len(times)] - dt.timedelta(minutes=i % 40),
                wait_ms=(0.4, 12.0, 480.0 + i, 5000.0 + 13 * i)[i % 4],
                queue_ms=None if i % 5 == 0 else 3.0 * i,
                source=("warm", "reused", "created")[i % 3],
                outcome="ok" if i % 7 else "timeout",
            )
            for i in range(80)
        ]
    )
    for i, acq in enumerate(Acquisition.objects.order_by("pk")):
        if i % 3 == 0 and i < len(made):
            acq.sandbox = made[i]
            acq.save(update_fields=["sandbox"])
    return busy.pk, quiet.pk


def _counts(flt: ChartFilter) -> dict[str, object]:
    return {
        "creates": overview.creates_per_bucket(flt),
        "address": operations.address_failures_per_minute(flt),
        "load": operations.address_failures_by_node_load(flt),
        "warm_hits": overview.warm_hits_by_job(flt),
        "warm_use": operations.warm_use_by_job_key(flt),
    }


def _filters(busy: int, quiet: int) -> list[ChartFilter]:
    return [_flt(), _flt(job_ids=(busy,)), _flt(backend="kubernetes"), _flt(job_ids=(busy, quiet))]


def test_counts_from_rollups_equal_the_raw_queries_with_edges_and_a_bucket_boundary() -> None:
    busy, quiet = _seed()
    raw = [_counts(f) for f in _filters(busy, quiet)]
    assert window_plan(SINCE, UNTIL, 1800) is None  # nothing materialised yet: raw
    counts = rollups_refresh(now=LATER)
    assert counts.buckets > 0 and counts.rows > 0
    plan = window_plan(SINCE, UNTIL, 1800)
    assert plan is not None and plan.rolled and plan.raw  # both parts are read
    assert ReadyRollup.objects.filter(job_id__isnull=True).exists()
    assert [_counts(f) for f in _filters(busy, quiet)] == raw
    in_window = Sandbox.objects.filter(requested_at__gte=SINCE, requested_at__lt=UNTIL).count()
    assert sum(r.creates for r in raw[0]["creates"]) == in_window > 0  # type: ignore[attr-defined]


def _all_raw() -> Plan:
    return Plan(rolled=(), raw=((SINCE, UNTIL),))


def _within(approx: float | None, exact: float | None) -> bool:
    assert approx is not None and exact is not None
    return abs(approx - exact) <= bins.ALPHA * abs(exact) + bins.MIN_MS + 1e-9


def test_percentiles_from_rollups_equal_the_binned_raw_rows_and_stay_within_the_bound() -> None:
    busy, _ = _seed()
    exact_ready = overview.ready_time_over_time(_flt())
    exact_split = overview.ready_time_by_image(_flt(job_ids=(busy,)))
    exact_wait = overview.acquisition_wait_over_time(_flt())
    rollups_refresh(now=LATER)
    for flt in (_flt(), _flt(job_ids=(busy,))):
        assert overview.ready_time_over_time(flt) == rolled.ready_time_over_time(flt, _all_raw())
        assert overview.acquisition_wait_over_time(flt) == rolled.acquisition_wait_over_time(
            flt, _all_raw()
        )
    from_rollups = overview.ready_time_over_time(_flt())
    assert [r.n for r in from_rollups] == [r.n for r in exact_ready]
    for got, want in zip(from_rollups, exact_ready, strict=True):
        assert got.bucket_start == want.bucket_start
        for name in ("p50_ms", "p90_ms", "p99_ms"):
            assert _within(getattr(got, name), getattr(want, name))
    for got, want in zip(
        overview.ready_time_by_image(_flt(job_ids=(busy,))), exact_split, strict=True
    ):
        assert got.image == want.image and got.n == want.n
        assert _within(got.p99_ms, want.p99_ms)
    waits = overview.acquisition_wait_over_time(_flt())
    assert [w.n for w in waits] == [w.n for w in exact_wait]
    for got, want in zip(waits, exact_wait, strict=True):
        assert _within(got.wait_p50_ms, want.wait_p50_ms)
        assert _within(got.wait_p99_ms, want.wait_p99_ms)
    assert sum(
        h.present + h.pulled + h.unknown for h in overview.ready_time_histogram(_flt())
    ) == sum(r.n for r in exact_ready)


def test_late_rows_and_a_row_moved_across_a_boundary_are_read_raw_then_rebuilt() -> None:
    busy, quiet = _seed()
    rollups_refresh(now=LATER)
    job = Sandbox.objects.get(pk=Sandbox.objects.order_by("pk")[0].pk).job
    # A late row in a materialised bucket, and one moved from just before T0 to just after.
    Sandbox.objects.bulk_create(
        [sandbox(job, requested_at=T0 - dt.timedelta(hours=2), ready_after_ms=4321, node="node-1")]
    )
    moved = Sandbox.objects.filter(requested_at=T0 - US).first()
    assert moved is not None
    moved.requested_at = T0 + dt.timedelta(seconds=1)
    moved.ready_at = T0 + dt.timedelta(seconds=3)
    moved.save()
    late = Acquisition.objects.first()
    assert late is not None
    late.finished_at = T0 - dt.timedelta(hours=7, microseconds=5)
    late.save()
    dirty = set(RollupDirty.objects.values_list("bucket", flat=True))
    t0 = int(T0.timestamp()) // BUCKET_S
    assert {t0 - 4, t0 - 1, t0} <= dirty  # the late row's, and both sides of the boundary
    flts = _filters(busy, quiet)
    while_dirty = [_counts(f) for f in flts]
    ready_dirty = overview.ready_time_over_time(_flt())
    RollupState.objects.filter(pk=1).update(watermark=0)  # read everything raw ...
    RollupDirty.objects.all().delete()
    assert [_counts(f) for f in flts] == while_dirty  # ... and get the same answers
    RollupDirty.objects.bulk_create([RollupDirty(bucket=b) for b in dirty])
    RollupState.objects.filter(pk=1).update(watermark=int(LATER.timestamp()) // BUCKET_S)
    rollups_refresh(now=LATER)
    assert not RollupDirty.objects.exists()
    assert [_counts(f) for f in flts] == while_dirty
    assert overview.ready_time_over_time(_flt()) == ready_dirty


def test_windows_of_short_buckets_read_raw_rows() -> None:
    _seed()
    rollups_refresh(now=LATER)
    assert window_plan(T0 - dt.timedelta(hours=6), T0, 600) is None
