"""Reads behind the training page (``/training/``): critical-path shares, steps, estimates.

Rules a reader must not break: the jobs shown are the ``TOP_JOBS`` with most steps ending
in the window (one aggregate query); each is attributed by
``sandboxes.training_selectors.critical_path`` (the pure Appendix J module underneath),
bounded to the window, so the cost grows with the jobs shown, never with all jobs. Time is
a parameter (the :class:`~dashboards.window.Window`).
"""

from __future__ import annotations

import datetime as dt

from django.db.models import Count

from dashboards.rows.training import JobEstimate, JobPathShares, StepShares
from dashboards.window import Window
from sandboxes.critical_path import LITTLE_CAVEAT
from sandboxes.models import LearnerStep
from sandboxes.training_selectors import CriticalPath, critical_path

TOP_JOBS = 8


def _paths(window: Window) -> list[tuple[int, str, CriticalPath]]:
    lo, hi = window.since.timestamp(), window.until.timestamp()
    top = (
        LearnerStep.objects.filter(wait_start__gte=lo, train_end__lte=hi)
        .values("job_id", "job__name")
        .annotate(steps=Count("pk"))
        .order_by("-steps", "job_id")[:TOP_JOBS]
    )
    return [
        (row["job_id"], row["job__name"], critical_path(row["job_id"], lo=lo, hi=hi)) for row in top
    ]


def job_shares(*, window: Window) -> list[JobPathShares]:
    """Figure 5's bars: each shown job's shares of summed step time in the window."""
    return [
        JobPathShares(
            job_id=job_id,
            job_name=name,
            steps=len(path.attribution.per_step),
            shares=dict(path.attribution.shares),
        )
        for job_id, name, path in _paths(window)
    ]


def step_shares(*, window: Window) -> list[StepShares]:
    """Every step of the shown jobs in the window with its own shares, by end time."""
    rows = [
        StepShares(
            job_id=job_id,
            step=step.step,
            ended_at=dt.datetime.fromtimestamp(step.end, tz=dt.UTC),
            interval_s=step.interval,
            shares=step.shares(),
        )
        for job_id, _, path in _paths(window)
        for step in path.attribution.per_step
    ]
    return sorted(rows, key=lambda r: (r.ended_at, r.job_id, r.step))


def job_estimates(*, window: Window) -> list[JobEstimate]:
    """Little's law vs the measured mean step interval per shown job, and the waiting share."""
    out = []
    for job_id, name, path in _paths(window):
        estimate = path.estimate
        out.append(
            JobEstimate(
                job_id=job_id,
                job_name=name,
                steps=len(path.attribution.per_step),
                measured_interval_s=estimate.measured_interval_s if estimate else None,
                estimated_interval_s=estimate.estimated_interval_s if estimate else None,
                f=estimate.f if estimate else None,
                waiting_share=path.waiting_share,
                caveat=LITTLE_CAVEAT,
            )
        )
    return out
