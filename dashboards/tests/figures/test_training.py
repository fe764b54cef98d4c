"""The per-step chart stays bounded: runs of steps merge into interval-weighted bars."""

from __future__ import annotations

import datetime as dt

import pytest

from dashboards.figures import training as figures
from dashboards.rows.training import StepShares
from sandboxes.critical_path import CATEGORIES

T = dt.datetime(2026, 10, 14, 12, 0, tzinfo=dt.UTC)
LEARNER, OTHER = CATEGORIES[-1], CATEGORIES[0]


def _step(job: int, step: int, interval: float, learner: float) -> StepShares:
    return StepShares(
        job_id=job,
        step=step,
        ended_at=T + dt.timedelta(seconds=10 * step + job),
        interval_s=interval,
        shares={LEARNER: learner, OTHER: 1.0 - learner},
    )


def test_few_steps_keep_one_bar_each() -> None:
    rows = [_step(1, n, 10.0, 0.5) for n in range(5)]
    assert figures.merged_steps(rows, limit=5) == rows
    figure = figures.step_shares_figure(rows)
    assert len(figure["data"][0]["x"]) == 5


def test_runs_of_a_jobs_steps_merge_into_interval_weighted_bars() -> None:
    """Job 1: steps of 10 s (learner 100 %) and 30 s (learner 0 %) alternate; two per bar
    gives 10 / 40 = 25 % learner. Job 2's steps are never merged with job 1's."""
    rows = [_step(1, n, 10.0 if n % 2 == 0 else 30.0, 1.0 if n % 2 == 0 else 0.0) for n in range(8)]
    rows += [_step(2, n, 20.0, 0.5) for n in range(8)]
    rows.sort(key=lambda r: (r.ended_at, r.job_id, r.step))
    merged = figures.merged_steps(rows, limit=8)
    assert len(merged) == 8
    ones = [r for r in merged if r.job_id == 1]
    assert [r.step for r in ones] == [1, 3, 5, 7]
    assert [r.interval_s for r in ones] == [40.0, 40.0, 40.0, 40.0]
    assert all(r.shares[LEARNER] == pytest.approx(0.25) for r in ones)
    assert all(r.shares[OTHER] == pytest.approx(0.75) for r in ones)
    assert all(r.shares[LEARNER] == pytest.approx(0.5) for r in merged if r.job_id == 2)
    assert [r.ended_at for r in merged] == sorted(r.ended_at for r in merged)
    assert ones[0].ended_at == rows[2].ended_at  # the run's last end (job 1, step 1)


def test_the_figure_draws_at_most_the_bound() -> None:
    rows = [_step(1, n, 5.0, 0.2) for n in range(figures.STEP_BARS * 3 + 7)]
    figure = figures.step_shares_figure(rows)
    assert 0 < len(figure["data"][0]["x"]) <= figures.STEP_BARS
