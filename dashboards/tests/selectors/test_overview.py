"""The dashboard aggregates on known data: SQLite locally, PostgreSQL in CI (DATABASE_URL).

Expected percentiles are ``percentile_cont`` by hand: for 1..100 s, p50 = 50.5 s,
p90 = 90.1 s, p99 = 99.01 s (rank (n-1)·f, interpolated between neighbours).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import NotSupportedError, connection
from django.db.models import F

from dashboards.filters import ChartFilter
from dashboards.selectors import overview as sel
from dashboards.sql import DurationMs, epoch_bucket, grouped_percentiles
from dashboards.tests.factories import acquisition, at, make_job, sandbox
from dashboards.window import window_ending
from sandboxes.models import Acquisition, Sandbox
from sandboxes.states import AcquisitionOutcome, SandboxState

pytestmark = pytest.mark.django_db

# The hour before T0+60 min: one-minute buckets.
WINDOW = window_ending(now=at(minutes=60), minutes=60)
approx = pytest.approx


def _ready_at(minute: int, second: int, after_ms: int, **fields: Any) -> Sandbox:
    """A sandbox Ready at T0+minute:second, requested ``after_ms`` earlier."""
    ready = at(minutes=minute, seconds=second)
    return sandbox(
        fields.pop("job"),
        requested_at=ready - dt.timedelta(milliseconds=after_ms),
        ready_after_ms=after_ms,
        **fields,
    )


def _seed_ready_times() -> None:
    job = make_job()
    # Minute 10: Ready 1..100 s after the request; the image was present on even ones.
    rows = [_ready_at(10, 30, 1000 * i, job=job, image_present=(i % 2 == 0)) for i in range(1, 101)]
    # Minute 20: one sandbox, 3 s, pulled.  Minute 30: 1 s and 2 s, image state unknown.
    rows.append(_ready_at(20, 1, 3000, job=job, image_present=False))
    rows.append(_ready_at(30, 5, 1000, job=job))
    rows.append(_ready_at(30, 6, 2000, job=job))
    # Left out: Ready before the window, never Ready, and Ready "before" its request.
    rows.append(_ready_at(-5, 0, 500, job=job))
    rows.append(sandbox(job, requested_at=at(minutes=40), state=SandboxState.CREATING))
    rows.append(sandbox(job, requested_at=at(minutes=41), ready_after_ms=-1000, image_present=True))
    Sandbox.objects.bulk_create(rows)


def test_create_to_ready_percentiles_per_bucket_match_percentile_cont() -> None:
    _seed_ready_times()
    rows = sel.ready_time_over_time(ChartFilter(WINDOW))
    assert [r.bucket_start for r in rows] == [at(minutes=10), at(minutes=20), at(minutes=30)]
    hundred, single, pair = rows
    assert hundred.n == 100
    assert hundred.p50_ms == approx(50500, abs=0.01)
    assert hundred.p90_ms == approx(90100, abs=0.01)
    assert hundred.p99_ms == approx(99010, abs=0.01)
    assert (single.n, single.p50_ms, single.p99_ms) == (1, approx(3000), approx(3000))
    assert (pair.n, pair.p50_ms, pair.p90_ms, pair.p99_ms) == (
        2,
        approx(1500),
        approx(1900),
        approx(1990),
    )


def test_pulled_vs_present_split_gives_each_image_class_its_own_percentiles() -> None:
    _seed_ready_times()
    split = {row.image: row for row in sel.ready_time_by_image(ChartFilter(WINDOW))}
    assert set(split) == {"present", "pulled", "unknown"}
    # Present: 2, 4, …, 100 s (50 values) → p50 = 51 s.  Pulled: 1, 3, …, 99 s and 3 s.
    assert split["present"].n == 50
    assert split["present"].p50_ms == approx(51000)
    assert split["present"].p99_ms == approx(99020)
    assert split["pulled"].n == 51
    assert split["pulled"].p50_ms == approx(49000)
    assert (split["unknown"].n, split["unknown"].p50_ms) == (2, approx(1500))


def test_histogram_bins_are_equal_and_count_every_ready_sandbox_once() -> None:
    _seed_ready_times()
    bins = sel.ready_time_histogram(ChartFilter(WINDOW), max_bins=10)
    # Longest 100 s over at most 10 bins → 10 s bins (1-2-5 steps).
    assert {b.width_ms for b in bins} == {10000}
    assert [b.start_ms for b in bins] == [10000 * i for i in range(11)]
    assert sum(b.present + b.pulled + b.unknown for b in bins) == 103
    first = bins[0]  # [0, 10 s): 1..9 s from minute 10, plus 3 s, 1 s and 2 s
    assert (first.present, first.pulled, first.unknown) == (4, 6, 2)
    assert (bins[-1].present, bins[-1].pulled) == (1, 0)  # exactly 100 s


def test_histogram_of_an_empty_window_is_empty() -> None:
    assert sel.ready_time_histogram(ChartFilter(WINDOW)) == []


def test_acquisition_wait_keeps_rows_without_a_queue_time_and_ignores_other_windows() -> None:
    job = make_job()
    Acquisition.objects.bulk_create(
        [
            acquisition(job, finished_at=at(minutes=5, seconds=s), wait_ms=w, queue_ms=q)
            for s, w, q in [(1, 100.0, 10.0), (2, 200.0, 20.0), (3, 300.0, None), (4, 400.0, 40.0)]
        ]
        + [
            acquisition(
                job,
                finished_at=at(minutes=6),
                wait_ms=600_000.0,
                queue_ms=599_000.0,
                outcome=AcquisitionOutcome.TIMEOUT,
            ),
            acquisition(job, finished_at=at(minutes=61), wait_ms=5.0),  # after the window
        ]
    )
    rows = sel.acquisition_wait_over_time(ChartFilter(WINDOW))
    assert [r.bucket_start for r in rows] == [at(minutes=5), at(minutes=6)]
    five, six = rows
    assert five.n == 4
    assert five.wait_p50_ms == approx(250)
    assert five.wait_p99_ms == approx(397)
    assert five.queue_p50_ms == approx(20)  # 10, 20, 40
    assert five.queue_p99_ms == approx(39.6)
    # A timed-out caller waited too: its wait is in the chart.
    assert (six.n, six.wait_p50_ms) == (1, approx(600_000))


def test_creates_per_bucket_gives_mean_rate_and_busiest_second() -> None:
    job = make_job()
    times = [at(minutes=2, seconds=5, ms=m) for m in (0, 100, 200, 900)]  # 4 in one second
    times += [at(minutes=2, seconds=6), at(minutes=3, seconds=1), at(minutes=3, seconds=59)]
    times += [at(minutes=61)]  # after the window
    Sandbox.objects.bulk_create(
        [sandbox(job, requested_at=t, state=SandboxState.REQUESTED) for t in times]
    )
    rows = sel.creates_per_bucket(ChartFilter(WINDOW))
    assert [(r.bucket_start, r.creates, r.peak_per_s) for r in rows] == [
        (at(minutes=2), 5, 4),
        (at(minutes=3), 2, 1),
    ]
    assert rows[0].mean_per_s == approx(5 / 60)


def test_live_sandboxes_by_state_lists_every_live_state_and_leaves_out_deleted() -> None:
    job = make_job()
    states = [SandboxState.READY] * 3 + [SandboxState.IN_USE, SandboxState.DELETED]
    Sandbox.objects.bulk_create([sandbox(job, requested_at=at(), state=s) for s in states])
    counts = {row.state: row.count for row in sel.live_sandboxes_by_state()}
    assert counts["ready"] == 3
    assert counts["in_use"] == 1
    assert counts["requested"] == 0
    assert "deleted" not in counts


def test_warm_hits_per_job_count_successes_by_source_in_one_query(
    django_assert_num_queries: object,
) -> None:
    a, b = make_job("alpha"), make_job("beta")
    ok = AcquisitionOutcome.OK
    Acquisition.objects.bulk_create(
        [acquisition(a, finished_at=at(minutes=1), wait_ms=1.0, source="warm") for _ in range(3)]
        + [
            acquisition(a, finished_at=at(minutes=1), wait_ms=1.0, source="reused"),
            acquisition(a, finished_at=at(minutes=1), wait_ms=1.0, source="created"),
            acquisition(
                a,
                finished_at=at(minutes=1),
                wait_ms=1.0,
                source="",
                outcome=AcquisitionOutcome.TIMEOUT,
            ),
            acquisition(b, finished_at=at(minutes=2), wait_ms=1.0, source="created", outcome=ok),
            acquisition(b, finished_at=at(minutes=2), wait_ms=1.0, source="created", outcome=ok),
            acquisition(b, finished_at=at(minutes=90), wait_ms=1.0, source="warm", outcome=ok),
        ]
    )
    with django_assert_num_queries(1):  # type: ignore[operator]
        rows = sel.warm_hits_by_job(ChartFilter(WINDOW))
    assert [(r.job_name, r.warm, r.reused, r.created) for r in rows] == [
        ("alpha", 3, 1, 1),
        ("beta", 0, 0, 2),
    ]
    assert rows[0].hit_rate == approx(0.8)
    assert rows[1].hit_rate == 0


def test_query_counts_do_not_grow_with_rows(django_assert_num_queries: object) -> None:
    """No N+1: each chart costs a fixed number of queries however many rows it reads."""
    _seed_ready_times()
    with django_assert_num_queries(1):  # type: ignore[operator]
        sel.ready_time_over_time(ChartFilter(WINDOW))
    with django_assert_num_queries(1):  # type: ignore[operator]
        sel.ready_time_by_image(ChartFilter(WINDOW))
    with django_assert_num_queries(2):  # type: ignore[operator]
        sel.ready_time_histogram(ChartFilter(WINDOW))
    with django_assert_num_queries(1):  # type: ignore[operator]
        sel.creates_per_bucket(ChartFilter(WINDOW))
    with django_assert_num_queries(2):  # type: ignore[operator]
        sel.acquisition_wait_over_time(ChartFilter(WINDOW))


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PERCENTILE_CONT is PostgreSQL's")
def test_window_function_fallback_agrees_with_postgres_percentile_cont() -> None:
    _seed_ready_times()
    kwargs: dict[str, Any] = dict(
        group=epoch_bucket("ready_at", 60),
        value=DurationMs(F("ready_at"), F("requested_at")),
        fractions=(0.0, 0.25, 0.5, 0.9, 0.99, 1.0),
    )
    qs = Sandbox.objects.filter(ready_at__isnull=False)
    native = grouped_percentiles(qs, method="native", **kwargs)
    window = grouped_percentiles(qs, method="window", **kwargs)
    assert [(g.group, g.n) for g in native] == [(g.group, g.n) for g in window]
    for a, b in zip(native, window, strict=True):
        assert a.values == approx(b.values, abs=1e-6)


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite has no PERCENTILE_CONT")
def test_native_percentiles_are_refused_on_sqlite_rather_than_guessed() -> None:
    with pytest.raises(NotSupportedError):
        grouped_percentiles(
            Sandbox.objects.all(),
            group=epoch_bucket("requested_at", 60),
            value=DurationMs(F("ready_at"), F("requested_at")),
            fractions=(0.5,),
            method="native",
        )
