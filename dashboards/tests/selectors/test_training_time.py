"""Waiting share and Little's law per bucket (``dashboards.selectors.training_time``).

Hand-computable timelines inside a fixed one-hour window with one-minute buckets; records go
in through the real ingest services; a shared Sandman acquisition is counted once (issue 11
item 3: "each create counted once").
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.utils import timezone

from dashboards.filters import ChartFilter
from dashboards.selectors import training_time as sel
from dashboards.tests.factories import make_job, sandbox
from dashboards.window import window_between
from sandboxes.critical_path import LITTLE_CAVEAT
from sandboxes.services.acquisitions import acquisition_record
from sandboxes.services.trajectories import learner_steps_report, trajectories_report

pytestmark = pytest.mark.django_db

T = 1_700_000_400.0  # a multiple of 60: bucket 0 is [T, T + 60)
WINDOW = window_between(
    since=dt.datetime.fromtimestamp(T, tz=dt.UTC),
    until=dt.datetime.fromtimestamp(T + 3600, tz=dt.UTC),
)


def traj(tid: str, slot: int, start: float, end: float, *phases: Any, **extra: Any) -> dict:
    return {
        "id": tid,
        "slot": slot,
        "group": extra.pop("group", "g1"),
        "start": T + start,
        "end": T + end,
        "failed": extra.pop("failed", False),
        "phases": [{"kind": k, "start": T + a, "end": T + b} for k, a, b in phases],
        **extra,
    }


def step(wait_start: float, wait_end: float, train_end: float) -> dict:
    return {
        "step": 1,
        "wait_start": T + wait_start,
        "wait_end": T + wait_end,
        "train_end": T + train_end,
        "groups": ["g1"],
    }


def seed(job_id: int, records: list[dict], steps: list[dict]) -> None:
    now = timezone.now()
    trajectories_report(job_id=job_id, records=records, now=now)
    learner_steps_report(job_id=job_id, records=steps, now=now)


def test_the_waiting_share_of_a_bucket_is_its_acquisition_over_its_trajectory_time() -> None:
    job = make_job("wait")
    seed(
        job.pk,
        [
            traj("a", 0, -100, 30, ("rollout_acquisition", -100, -90)),  # 130 s, 10 acquiring
            traj("b", 1, -50, 50, ("rollout_acquisition", -50, -40)),  # 100 s, 10 acquiring
            traj("c", 0, 30, 100, ("grading_acquisition", 90, 95)),  # next bucket: 70 s, 5
        ],
        [step(0, 50, 55)],
    )
    rows = sel.waiting_share_over_time(ChartFilter(WINDOW))
    assert [(r.bucket_start.timestamp() - T, r.trajectories) for r in rows] == [(0, 2), (60, 1)]
    assert rows[0].waiting_share == pytest.approx(20 / 230)
    assert rows[1].waiting_share == pytest.approx(5 / 70)


def test_one_sandman_acquisition_named_by_two_trajectories_is_counted_once() -> None:
    job = make_job("shared")
    box = sandbox(job, requested_at=dt.datetime.fromtimestamp(T - 100, tz=dt.UTC))
    box.save()
    acquisition_record(
        job_id=job.pk,
        role="rollout",
        image="sandman/empty",
        key_hash="k",
        outcome="ok",
        sandbox_id=box.pk,
        started_at=dt.datetime.fromtimestamp(T - 60, tz=dt.UTC),
        now=dt.datetime.fromtimestamp(T - 48, tz=dt.UTC),
    )
    shared = ("rollout_acquisition", -60, -50)
    seed(
        job.pk,
        [
            traj("a", 0, -60, 20, shared, sandbox_ids=[box.pk]),
            traj("b", 1, -60, 40, shared, sandbox_ids=[box.pk]),
        ],
        [step(0, 40, 45)],
    )
    (row,) = sel.waiting_share_over_time(ChartFilter(WINDOW))
    assert row.acquisition_s == pytest.approx(12.0)  # Sandman's 12 s, once, not 24
    assert row.waiting_share == pytest.approx(12 / 180)


def test_little_s_law_per_bucket_beside_the_measured_interval() -> None:
    job = make_job("little")
    # Two consumed trajectories end in bucket 0; one failed attempt (retried by b) too.
    seed(
        job.pk,
        [
            traj("x", 1, 0, 10, failed=True),
            traj("a", 0, 0, 40, ("rollout_acquisition", 0, 4)),
            traj("b", 1, 10, 50, ("rollout_acquisition", 10, 12), predecessor="x"),
        ],
        [step(0, 50, 58)],
    )
    (row,) = sel.estimate_over_time(ChartFilter(WINDOW))
    assert row.steps == 1 and row.measured_interval_s == pytest.approx(58.0)
    # per step 2 × mean trajectory (10+40+40)/2 = 45 ÷ in flight 90/60 = 1.5 → 60 s
    assert row.estimated_interval_s == pytest.approx(60.0)
    assert row.f == pytest.approx((4 + 2 + 10) / 90)
    assert row.caveat == LITTLE_CAVEAT


def test_only_the_filtered_jobs_are_drawn() -> None:
    shown, hidden = make_job("shown"), make_job("hidden")
    for job in (shown, hidden):
        seed(
            job.pk,
            [traj("a", 0, 0, 30, ("rollout_acquisition", 0, 3))],
            [step(0, 30, 35)],
        )
    assert {r.job_id for r in sel.waiting_share_over_time(ChartFilter(WINDOW))} == {
        shown.pk,
        hidden.pk,
    }
    only = ChartFilter(WINDOW, job_ids=(shown.pk,))
    assert {r.job_id for r in sel.waiting_share_over_time(only)} == {shown.pk}
    assert {r.job_id for r in sel.estimate_over_time(only)} == {shown.pk}
    assert sel.waiting_share_over_time(ChartFilter(WINDOW, backend="kubernetes")) == []
