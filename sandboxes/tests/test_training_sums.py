"""The grouped waiting share and Little's-law sums (``sandboxes.training_sums``, one query
for several jobs) give what the per-job queries give (``training_selectors.waiting_share``
and the estimate of ``critical_path_of``): clipped trajectories and phases at the span's
edges, failed members, dropped groups, a job with no step in the range, and one Sandman
create named by two trajectories counted once. Appendix J (waiting share, Little's law)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection

from sandboxes.models import Job
from sandboxes.services.acquisitions import acquisition_record
from sandboxes.services.trajectories import learner_steps_report, trajectories_report
from sandboxes.tests.api_support import make_job, make_user, seed_sandbox
from sandboxes.training_selectors import attributed_steps, critical_path_of, critical_paths_of

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the grouped query is PostgreSQL's"
    ),
]

T0 = 1_780_000_000.0
NOW = dt.datetime(2026, 12, 2, tzinfo=dt.UTC)


def _t(tid: str, slot: int, group: str, start: float, end: float, **over: Any) -> dict:
    record = {
        "id": tid,
        "slot": slot,
        "group": group,
        "start": T0 + start,
        "end": T0 + end,
        "failed": False,
        "phases": [
            {"kind": "rollout_acquisition", "start": T0 + start, "end": T0 + start + 7},
            {"kind": "generation", "start": T0 + start + 7, "end": T0 + end - 3},
            {"kind": "grading_acquisition", "start": T0 + end - 3, "end": T0 + end},
        ],
    }
    record.update(over)
    return record


def _step(n: int, wait_start: float, wait_end: float, groups: list[str], **over: Any) -> dict:
    return {
        "step": n,
        "wait_start": T0 + wait_start,
        "wait_end": T0 + wait_end,
        "train_end": T0 + wait_end + 20,
        "groups": groups,
        **over,
    }


def _job_with_history(user: Any, shift: float) -> int:
    job = make_job(user)
    s = shift
    records = [
        _t("before", 0, "g0", s - 50, s + 15),  # straddles the span's start
        _t("a", 1, "g1", s + 5, s + 90),
        _t("a-failed", 2, "g1", s + 5, s + 40, failed=True),
        _t("a-retry", 2, "g1", s + 41, s + 95, predecessor="a-failed"),
        _t("dropped", 3, "g2", s + 10, s + 60),
        _t("b", 0, "g3", s + 100, s + 170),
        _t("late", 1, "g9", s + 180, s + 400),  # straddles the span's end, no step's group
    ]
    trajectories_report(job_id=job.pk, records=records, now=NOW)
    steps = [
        _step(1, s + 0, s + 96, ["g1"], dropped_groups=["g2"]),
        _step(2, s + 116, s + 172, ["g3"]),
    ]
    learner_steps_report(job_id=job.pk, records=steps, now=NOW)
    return job.pk


def _shared_create(user: Any) -> int:
    """Two trajectories naming one sandbox Sandman acquired: one wait, counted once."""
    job = make_job(user)
    sandbox = seed_sandbox(Job.objects.get(pk=job.pk), role="rollout")
    at = dt.datetime.fromtimestamp(T0, tz=dt.UTC)
    acquisition_record(
        job_id=job.pk,
        role="rollout",
        image="sandman/empty",
        key_hash="k",
        outcome="ok",
        sandbox_id=sandbox.pk,
        started_at=at + dt.timedelta(seconds=1),
        now=at + dt.timedelta(seconds=6),
    )
    records = [
        _t(tid, slot, "g1", 0, 80, sandbox_ids=[sandbox.pk]) for tid, slot in (("x", 0), ("y", 1))
    ]
    trajectories_report(job_id=job.pk, records=records, now=NOW)
    learner_steps_report(job_id=job.pk, records=[_step(1, 0, 82, ["g1"])], now=NOW)
    return job.pk


def test_one_grouped_query_gives_each_jobs_waiting_share_and_estimate() -> None:
    user, _ = make_user("alice")
    jobs = [_job_with_history(user, 0.0), _job_with_history(user, 1000.0), _shared_create(user)]
    empty = make_job(user).pk
    items = [(job_id, attributed_steps(job_id, lo=T0 - 1, hi=T0 + 2000)) for job_id in jobs]
    items.append((empty, attributed_steps(empty)))
    one_by_one = [critical_path_of(job_id, steps) for job_id, steps in items]

    grouped = critical_paths_of(items)

    assert len(grouped) == len(items)
    for alone, together in zip(one_by_one[:-1], grouped[:-1], strict=True):
        assert alone.estimate is not None and together.estimate is not None
        assert together.waiting_share == pytest.approx(alone.waiting_share, rel=1e-12)
        for field in ("trajectories_per_step", "mean_trajectory_s", "mean_in_flight", "f"):
            assert getattr(together.estimate, field) == pytest.approx(
                getattr(alone.estimate, field), rel=1e-12
            )
        assert together.attribution is alone.attribution
    assert (grouped[-1].waiting_share, grouped[-1].estimate) == (None, None)
    # By hand for the first job: its steps span [0, 192]; trajectory time clipped to it
    # 15+85+35+54+50+70+12 = 321 s; acquisition clipped: "before" 3 (its first phase ends
    # before 0), 10 each for the five inside, 7 for "late" (its last phase is after 192).
    assert one_by_one[0].waiting_share == pytest.approx((3 + 5 * 10 + 7) / 321.0)
    # The shared create counted once: two trajectories' 5 s of Sandman's time, once,
    # plus their trainer-timed grading acquisitions (3 s each), over 160 s.
    assert one_by_one[2].waiting_share == pytest.approx((5 + 3 + 3) / 160.0)
