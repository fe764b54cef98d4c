"""The grading page at ``/gradings/``: verdicts per minute, no_verdict and probe-refusal
rates, grading acquisition by source, creates per grading.

A live page built by the same machinery as the others (``pages.charts``) under the same
access rule (``dashboards.access``): data at ``/gradings/data/<chart>.csv|json``. The
charts follow ``grading.state`` (published by ``grading.services`` when a grading reaches
its verdict) and the acquisition and sandbox events of the grading sandboxes.
"""

from __future__ import annotations

from dashboards.access import operator_data, operator_page
from dashboards.figures import grading as figures
from dashboards.filters import ChartFilter
from dashboards.pages.charts import Chart, ChartPage, ChartTable
from dashboards.rows.grading import JobCreates, SourceLatency, VerdictBucket
from dashboards.selectors import grading as sel

DATA_URL = "/gradings/data/"
GRADING_EVENTS = ("grading.state",)


def _verdicts(flt: ChartFilter) -> ChartTable:
    rows = sel.verdicts_per_bucket(flt)
    return figures.verdicts_figure(rows, window=flt.window), VerdictBucket.TABLE, rows


def _rates(flt: ChartFilter) -> ChartTable:
    rows = sel.verdicts_per_bucket(flt)
    return figures.rates_figure(rows, window=flt.window), VerdictBucket.TABLE, rows


def _acquisition(flt: ChartFilter) -> ChartTable:
    rows = sel.acquisition_by_source(flt)
    return figures.acquisition_figure(rows), SourceLatency.TABLE, rows


def _creates(flt: ChartFilter) -> ChartTable:
    rows = sel.creates_per_grading(flt)
    return figures.creates_figure(rows), JobCreates.TABLE, rows


CHARTS: dict[str, Chart] = {
    "verdicts": Chart(
        "Gradings per minute by verdict",
        "Gradings that reached their verdict in each bucket: resolved, unresolved (a valid "
        "0: failing tests or a patch that does not apply) and no_verdict (infrastructure "
        "failures, resampled, never scored).",
        _verdicts,
        refresh_on=GRADING_EVENTS,
    ),
    "rates": Chart(
        "no_verdict and probe-refusal rates",
        "Share of each bucket's gradings that ended no_verdict, and that had at least one "
        "sandbox refused because its /probe readings contradicted the task's declaration.",
        _rates,
        refresh_on=GRADING_EVENTS,
    ),
    "acquisition": Chart(
        "Grading acquisition p50 / p99 by source",
        "Successful acquisitions of grading sandboxes in the window, queue included: fresh "
        "(created for the grading), warm (never used) and reused (checked and restored).",
        _acquisition,
        refresh_on=("acquisition",),
    ),
    "creates": Chart(
        "Creates per grading",
        "Per job: grading sandboxes requested in the window over gradings decided in it "
        "(checked reuse and the warm pool bring it under one).",
        _creates,
        refresh_on=("sandbox.state", "sandbox", *GRADING_EVENTS),
    ),
}


PAGE = ChartPage(CHARTS, page_title="gradings", heading="Gradings, live", data_url=DATA_URL)

gradings = operator_page(PAGE.page)
chart_json = operator_data(PAGE.chart_json)
chart_csv = operator_data(PAGE.chart_csv)
