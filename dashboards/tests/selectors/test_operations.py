"""The operations page's aggregates on known rows: SQLite locally, PostgreSQL in CI.

The window is the hour after ``T0`` (one-minute buckets); rows are written directly with
exact times (``dashboards.tests.factories``), as the overview's selector tests do.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from dashboards.filters import ChartFilter
from dashboards.selectors import operations as sel
from dashboards.tests.factories import acquisition, at, make_job, sandbox
from dashboards.window import window_ending
from incidents import selectors as incident_selectors
from sandboxes.models import Acquisition, Sandbox
from sandboxes.states import AcquisitionOutcome

pytestmark = pytest.mark.django_db

WINDOW = window_ending(now=at(minutes=60), minutes=60)
approx = pytest.approx


def _seed_address_failures() -> None:
    job = make_job()
    rows = [
        # n1: two sandboxes requested in minute 10 (load 2); the second scheduled in 11.
        sandbox(
            job,
            requested_at=at(10, 5),
            scheduled_at=at(10, 20),
            node="n1",
            address_failures=2,
        ),
        sandbox(
            job,
            requested_at=at(10, 50),
            scheduled_at=at(11, 10),
            node="n1",
            address_failures=1,
        ),
        # n2: alone in minute 10 (load 1), never scheduled: counted at its request.
        sandbox(job, requested_at=at(10, 30), node="n2", address_failures=0),
        # No node: in the per-minute sum, not in the by-load view.
        sandbox(job, requested_at=at(20, 0), scheduled_at=at(20, 1), address_failures=4),
        # Before the window: left out of both.
        sandbox(job, requested_at=at(-5), scheduled_at=at(-5), node="n1", address_failures=9),
    ]
    Sandbox.objects.bulk_create(rows)


def test_address_failures_are_summed_per_minute_of_scheduling_else_request() -> None:
    _seed_address_failures()
    rows = sel.address_failures_per_minute(ChartFilter(WINDOW))
    assert [(r.bucket_start, r.sandboxes, r.address_failures) for r in rows] == [
        (at(10), 2, 2),
        (at(11), 1, 1),
        (at(20), 1, 4),
    ]
    assert rows[0].failures_per_min == 2.0


def test_address_failures_by_node_load_count_sandboxes_per_node_and_bucket() -> None:
    _seed_address_failures()
    rows = sel.address_failures_by_node_load(ChartFilter(WINDOW))
    assert [(r.node_load, r.sandboxes, r.address_failures) for r in rows] == [(1, 1, 0), (2, 2, 3)]
    assert rows[1].failures_per_sandbox == 1.5


def test_sandboxes_without_address_events_are_counted_unknown_not_as_zero_failures() -> None:
    """No core/v1 Event told (expired, dropped): ``address_failures`` is NULL -- the views
    count such sandboxes as unknown and leave them out of the per-sandbox rate."""
    job = make_job()
    Sandbox.objects.bulk_create(
        [
            sandbox(job, requested_at=at(10, 5), node="n1", address_failures=3),
            sandbox(job, requested_at=at(10, 6), node="n1", address_failures=None),
        ]
    )
    (minute,) = sel.address_failures_per_minute(ChartFilter(WINDOW))
    assert (minute.sandboxes, minute.address_failures, minute.unknown) == (2, 3, 1)
    (load,) = sel.address_failures_by_node_load(ChartFilter(WINDOW))
    assert (load.sandboxes, load.unknown, load.failures_per_sandbox) == (2, 1, 3.0)


def _keyed(row, key: str):  # type: ignore[no-untyped-def]
    row.key_hash = key
    return row


def _seed_warm_use() -> None:
    a, b, c = make_job("a"), make_job("b"), make_job("c")
    ok = AcquisitionOutcome.OK
    Acquisition.objects.bulk_create(
        [
            _keyed(acquisition(a, finished_at=at(12), wait_ms=5, source="warm"), "ka"),
            _keyed(acquisition(a, finished_at=at(13), wait_ms=5, source="reused"), "ka"),
            _keyed(acquisition(a, finished_at=at(14), wait_ms=900, source="created"), "ka"),
            _keyed(acquisition(a, finished_at=at(15), wait_ms=900, source="created"), "ka"),
            # Not counted: a timeout, and a warm hit before the window.
            _keyed(
                acquisition(
                    a, finished_at=at(16), wait_ms=60_000, outcome=AcquisitionOutcome.TIMEOUT
                ),
                "ka",
            ),
            _keyed(acquisition(a, finished_at=at(-1), wait_ms=5, source="warm"), "ka"),
            _keyed(acquisition(b, finished_at=at(21), wait_ms=5, source="warm", outcome=ok), "kb"),
        ]
    )
    Sandbox.objects.bulk_create(
        [
            # a/ka: Ready at 10, handed out warm at 40: 30 min idle.
            _keyed(
                sandbox(
                    a, requested_at=at(9), ready_after_ms=60_000, source="warm", acquired_at=at(40)
                ),
                "ka",
            ),
            # a/ka: Ready at 50, still warm at the window's end (now = T0+60): 10 min.
            _keyed(sandbox(a, requested_at=at(49), ready_after_ms=60_000), "ka"),
            # a/ka: Ready before the window, deleted at 15: clipped to 15 min.
            _keyed(
                sandbox(a, requested_at=at(-31), ready_after_ms=60_000, deleted_at=at(15)),
                "ka",
            ),
            # a/ka: a caller's own create (not warm), and a warm pod gone before the window.
            _keyed(
                sandbox(
                    a,
                    requested_at=at(4),
                    ready_after_ms=60_000,
                    source="created",
                    acquired_at=at(6),
                ),
                "ka",
            ),
            _keyed(
                sandbox(a, requested_at=at(-31), ready_after_ms=60_000, deleted_at=at(-10)),
                "ka",
            ),
            # b/kb: 30 s warm.  c/kc: warm for the last 5 min, never asked for.
            _keyed(
                sandbox(
                    b,
                    requested_at=at(19),
                    ready_after_ms=60_000,
                    source="warm",
                    acquired_at=at(20, 30),
                ),
                "kb",
            ),
            _keyed(sandbox(c, requested_at=at(54), ready_after_ms=60_000), "kc"),
        ]
    )


def test_warm_hit_rate_and_idle_pod_hours_per_job_and_key() -> None:
    _seed_warm_use()
    rows = {(r.job_name, r.key_hash): r for r in sel.warm_use_by_job_key(ChartFilter(WINDOW))}
    assert set(rows) == {("a", "ka"), ("b", "kb"), ("c", "kc")}
    a, b, c = rows["a", "ka"], rows["b", "kb"], rows["c", "kc"]
    assert (a.hits, a.acquisitions, a.hit_rate) == (2, 4, 0.5)
    assert (a.warm_pods, a.idle_pod_hours) == (3, approx(0.5 + 10 / 60 + 0.25, abs=1e-6))
    assert (b.hits, b.acquisitions, b.hit_rate, b.warm_pods) == (1, 1, 1.0, 1)
    assert b.idle_pod_hours == approx(30 / 3600, abs=1e-6)
    assert (c.acquisitions, c.hit_rate, c.warm_pods) == (0, None, 1)
    assert c.idle_pod_hours == approx(5 / 60, abs=1e-6)


def test_warm_use_costs_three_queries_however_many_keys() -> None:
    """Hits per key, idle time per key (grouped without the job's name, so PostgreSQL can
    answer it from the partial index ``sandbox_warm_idle``), and the names of those jobs."""
    _seed_warm_use()
    with CaptureQueriesContext(connection) as queries:
        sel.warm_use_by_job_key(ChartFilter(WINDOW))
    assert len(queries) == 3


def test_incident_hours_by_class_are_the_accounting_selectors_rows() -> None:
    """Table A49: the class rows of ``incidents.selectors.accounting``, unchanged."""
    call_command("loaddata", "paper_cases", verbosity=0)
    rows = {(r.path, r.label): r for r in sel.incident_gpu_hours_by_class()}
    expected = incident_selectors.accounting().by_class
    assert len(rows) == len(expected) == 6
    for row in expected:
        mine = rows[row.path, row.label]
        assert (Decimal(str(mine.gpu_hours_low)), Decimal(str(mine.gpu_hours_high))) == (
            row.bounds.low,
            row.bounds.high,
        )
        assert (mine.cause_class, mine.cases) == (row.key, row.bounds.cases)
    top = rows["sandbox", "sandbox implementation"]
    assert (top.gpu_hours_low, top.gpu_hours_high, top.cases) == (974.0, 1469.0, 2)
