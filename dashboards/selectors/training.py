"""Reads behind the training page (``/training/``): critical-path shares, steps, estimates.

Rules a reader must not break: the jobs shown are the filter's top N (``ChartFilter.top``,
default 8) with most steps in the window among the jobs and backend it selects (one
aggregate query, :func:`shown_jobs`); each is attributed by
``sandboxes.training_selectors.attributed_steps`` (the pure Appendix J module underneath),
bounded to the window, so the cost grows with the jobs shown, never with all jobs. Time is
a parameter (the :class:`~dashboards.filters.ChartFilter`'s window).
"""

from __future__ import annotations

import datetime as dt

from django.db.models import Count

from dashboards.filters import DEFAULT_TOP, ChartFilter
from dashboards.rows.training import JobEstimate, JobPathShares, StepShares
from sandboxes.critical_path import LITTLE_CAVEAT
from sandboxes.models import LearnerStep
from sandboxes.training_selectors import (
    AttributedSteps,
    CriticalPath,
    attributed_steps,
    critical_paths_of,
)

TOP_JOBS = DEFAULT_TOP


def shown_jobs(flt: ChartFilter) -> list[tuple[int, str]]:
    """The filter's top N jobs by steps inside the window, most steps first; one query."""
    return flt.remember("training.shown_jobs", lambda: _shown_jobs(flt))


def _shown_jobs(flt: ChartFilter) -> list[tuple[int, str]]:
    lo, hi = flt.window.since.timestamp(), flt.window.until.timestamp()
    top = (
        flt.job_rows(LearnerStep.objects.filter(wait_start__gte=lo, train_end__lte=hi))
        .values("job_id", "job__name")
        .annotate(steps=Count("pk"))
        .order_by("-steps", "job_id")[: flt.top]
    )
    return [(row["job_id"], row["job__name"]) for row in top]


def _attributed(flt: ChartFilter) -> list[tuple[int, str, AttributedSteps]]:
    """Each shown job's attributed steps, computed once per request (the page's charts
    share it; only the estimates add the sums over trajectories, :func:`_paths`)."""
    lo, hi = flt.window.since.timestamp(), flt.window.until.timestamp()
    return flt.remember(
        "training.attributed",
        lambda: [
            (job_id, name, attributed_steps(job_id, lo=lo, hi=hi))
            for job_id, name in shown_jobs(flt)
        ],
    )


def _paths(flt: ChartFilter) -> list[tuple[int, str, CriticalPath]]:
    """Each shown job's critical path with its waiting share and estimate, once per request
    (the sums of all shown jobs in one query on PostgreSQL, ``critical_paths_of``)."""
    return flt.remember("training.paths", lambda: _compute_paths(flt))


def _compute_paths(flt: ChartFilter) -> list[tuple[int, str, CriticalPath]]:
    shown = _attributed(flt)
    paths = critical_paths_of([(job_id, steps) for job_id, _, steps in shown])
    return [(job_id, name, path) for (job_id, name, _), path in zip(shown, paths, strict=True)]


def job_shares(flt: ChartFilter) -> list[JobPathShares]:
    """Figure 5's bars: each shown job's shares of summed step time in the window."""
    return [
        JobPathShares(
            job_id=job_id,
            job_name=name,
            steps=len(steps.attribution.per_step),
            shares=dict(steps.attribution.shares),
        )
        for job_id, name, steps in _attributed(flt)
    ]


def step_shares(flt: ChartFilter) -> list[StepShares]:
    """Every step of the shown jobs in the window with its own shares, by end time."""
    rows = [
        StepShares(
            job_id=job_id,
            step=step.step,
            ended_at=dt.datetime.fromtimestamp(step.end, tz=dt.UTC),
            interval_s=step.interval,
            shares=step.shares(),
        )
        for job_id, _, steps in _attributed(flt)
        for step in steps.attribution.per_step
    ]
    return sorted(rows, key=lambda r: (r.ended_at, r.job_id, r.step))


def job_estimates(flt: ChartFilter) -> list[JobEstimate]:
    """Little's law vs the measured mean step interval per shown job, and the waiting share."""
    out = []
    for job_id, name, path in _paths(flt):
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
