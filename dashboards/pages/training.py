"""The training page at ``/training/``: where learner-step time went (Appendix J, Figure 5).

A live page built by ``pages.charts`` under ``dashboards.access``, like ``pages.operations``:
data at ``/training/data/<chart>.csv|json``. Every chart refetches when a trajectory or
learner-step batch is stored (``trajectories`` and ``learner_steps`` events, published by
``sandboxes.services.trajectories`` after commit).
"""

from __future__ import annotations

from dashboards.access import operator_data, operator_page
from dashboards.figures import training as figures
from dashboards.filters import ChartFilter
from dashboards.pages.charts import Chart, ChartPage, ChartTable
from dashboards.rows.training import (
    EstimateBucket,
    JobEstimate,
    JobPathShares,
    StepShares,
    WaitingShareBucket,
)
from dashboards.selectors import training as sel
from dashboards.selectors import training_time

DATA_URL = "/training/data/"
REFRESH_ON = ("trajectories", "learner_steps")


def _critical_path(flt: ChartFilter) -> ChartTable:
    rows = sel.job_shares(flt)
    return figures.critical_path_figure(rows), JobPathShares.TABLE, rows


def _step_shares(flt: ChartFilter) -> ChartTable:
    rows = sel.step_shares(flt)
    return figures.step_shares_figure(rows, window=flt.window), StepShares.TABLE, rows


def _waiting_share(flt: ChartFilter) -> ChartTable:
    rows = training_time.waiting_share_over_time(flt)
    return figures.waiting_share_figure(rows, window=flt.window), WaitingShareBucket.TABLE, rows


def _estimate(flt: ChartFilter) -> ChartTable:
    rows = sel.job_estimates(flt)
    return figures.estimate_figure(rows), JobEstimate.TABLE, rows


def _estimate_time(flt: ChartFilter) -> ChartTable:
    rows = training_time.estimate_over_time(flt)
    return figures.estimate_time_figure(rows, window=flt.window), EstimateBucket.TABLE, rows


CHARTS: dict[str, Chart] = {
    "critical_path": Chart(
        "Critical-path shares per job (Figure 5)",
        "Each learner step's wait is attributed to the trajectory that ended it, the slowest "
        "member of the last group to complete, and back through failed predecessors and slot "
        "occupants (Appendix J); the rest of the step is the learner's. The top N jobs "
        f"(default {sel.TOP_JOBS}, ?top=) by steps in the window.",
        _critical_path,
        refresh_on=REFRESH_ON,
    ),
    "step_shares": Chart(
        "Per-step shares over time",
        "One stacked bar per learner step of the jobs above, at the time its training ended. "
        f"Over {figures.STEP_BARS} steps, each job's runs of consecutive steps share "
        "one bar (their interval-weighted mean shares, at the run's last end); the CSV "
        "lists every step.",
        _step_shares,
        refresh_on=REFRESH_ON,
    ),
    "waiting_share": Chart(
        "Waiting share over time",
        "Per shown job: summed sandbox acquisition over summed trajectory time of the "
        "trajectories that ended in each bucket, each Sandman acquisition counted once.",
        _waiting_share,
        refresh_on=REFRESH_ON,
    ),
    "estimate": Chart(
        "Little's law vs measured step interval",
        "Estimate = trajectories per step × mean trajectory time ÷ mean trajectories in "
        "flight, beside the measured mean interval. f, the share of trajectory time in "
        "sandbox acquisition and failed attempts, estimates the step reduction from removing "
        "them. An estimate from a fixed-concurrency model, not a measurement: it assumes the "
        "run stays generation-bound. Waiting share: acquisition over trajectory time.",
        _estimate,
        refresh_on=REFRESH_ON,
    ),
    "estimate_time": Chart(
        "Little's law vs measured step interval over time",
        "Per shown job and bucket: the measured mean interval of the steps that ended in it "
        "(solid) and the estimate (dashed) from the trajectories that ended in it and the "
        "time in flight inside it. An estimate from a fixed-concurrency model, not a "
        "measurement.",
        _estimate_time,
        refresh_on=REFRESH_ON,
    ),
}


PAGE = ChartPage(CHARTS, page_title="training", heading="Training, live", data_url=DATA_URL)

training = operator_page(PAGE.page)
chart_json = operator_data(PAGE.chart_json)
chart_csv = operator_data(PAGE.chart_csv)
