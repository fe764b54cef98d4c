"""The training page at ``/training/``: where learner-step time went (Appendix J, Figure 5).

A live page built by ``pages.charts`` under ``dashboards.access``, like ``pages.operations``:
data at ``/training/data/<chart>.csv|json``. Every chart refetches when a trajectory or
learner-step batch is stored (``trajectories`` and ``learner_steps`` events, published by
``sandboxes.services.trajectories`` after commit).
"""

from __future__ import annotations

from dashboards.access import operator_data, operator_page
from dashboards.figures import training as figures
from dashboards.pages.charts import Chart, ChartPage, ChartTable
from dashboards.rows.training import JobEstimate, JobPathShares, StepShares
from dashboards.selectors import training as sel
from dashboards.window import Window

DATA_URL = "/training/data/"
REFRESH_ON = ("trajectories", "learner_steps")


def _critical_path(window: Window) -> ChartTable:
    rows = sel.job_shares(window=window)
    return figures.critical_path_figure(rows), JobPathShares.TABLE, rows


def _step_shares(window: Window) -> ChartTable:
    rows = sel.step_shares(window=window)
    return figures.step_shares_figure(rows, window=window), StepShares.TABLE, rows


def _estimate(window: Window) -> ChartTable:
    rows = sel.job_estimates(window=window)
    return figures.estimate_figure(rows), JobEstimate.TABLE, rows


CHARTS: dict[str, Chart] = {
    "critical_path": Chart(
        "Critical-path shares per job (Figure 5)",
        "Each learner step's wait is attributed to the trajectory that ended it, the slowest "
        "member of the last group to complete, and back through failed predecessors and slot "
        f"occupants (Appendix J); the rest of the step is the learner's. Top {sel.TOP_JOBS} "
        "jobs by steps ending in the window.",
        _critical_path,
        refresh_on=REFRESH_ON,
    ),
    "step_shares": Chart(
        "Per-step shares over time",
        "One stacked bar per learner step of the jobs above, at the time its training ended.",
        _step_shares,
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
}


PAGE = ChartPage(CHARTS, page_title="training", heading="Training, live", data_url=DATA_URL)

training = operator_page(PAGE.page)
chart_json = operator_data(PAGE.chart_json)
chart_csv = operator_data(PAGE.chart_csv)
