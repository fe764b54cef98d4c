"""The overview page at ``/``: live sandboxes, creates, waits, create-to-Ready, warm hits.

Every chart is one entry of :data:`CHARTS`: a selector call (``selectors.overview``), a
figure (``figures.overview``) and the table shown beside it and offered as CSV and JSON at
``/dashboard/data/<chart>.csv|json`` (docs/architecture.md §8). The page machinery is
``pages.charts``; access is ``dashboards.access`` (staff only). These charts refresh on the
page script's own event map (no ``refresh_on``).
"""

from __future__ import annotations

from dashboards.access import operator_data, operator_page
from dashboards.figures import overview as figures
from dashboards.filters import ChartFilter
from dashboards.pages.charts import Chart, ChartPage, ChartTable
from dashboards.rows.overview import (
    CreateRate,
    HistogramBin,
    ImageSplit,
    LatencyBucket,
    StateCount,
    WaitBucket,
    WarmHits,
)
from dashboards.selectors import overview as sel
from dashboards.selectors.rolled import ROLLUP_CAPTION
from sandboxes.states import SANDBOX_COLOURS

DATA_URL = "/dashboard/data/"


def _states(flt: ChartFilter) -> ChartTable:
    rows = sel.live_sandboxes_by_state(flt)
    colours = {str(k): v for k, v in SANDBOX_COLOURS.items()}
    return figures.states_figure(rows, colours=colours), StateCount.TABLE, rows


def _creates(flt: ChartFilter) -> ChartTable:
    rows = sel.creates_per_bucket(flt)
    return figures.creates_figure(rows, window=flt.window), CreateRate.TABLE, rows


def _acquire_wait(flt: ChartFilter) -> ChartTable:
    rows = sel.acquisition_wait_over_time(flt)
    return figures.wait_figure(rows, window=flt.window), WaitBucket.TABLE, rows


def _ready_time(flt: ChartFilter) -> ChartTable:
    rows = sel.ready_time_over_time(flt)
    return figures.ready_time_figure(rows, window=flt.window), LatencyBucket.TABLE, rows


def _ready_hist(flt: ChartFilter) -> ChartTable:
    rows = sel.ready_time_histogram(flt)
    return figures.ready_histogram_figure(rows), HistogramBin.TABLE, rows


def _ready_split(flt: ChartFilter) -> ChartTable:
    rows = sel.ready_time_by_image(flt)
    return figures.ready_split_figure(rows), ImageSplit.TABLE, rows


def _warm_hits(flt: ChartFilter) -> ChartTable:
    rows = sel.warm_hits_by_job(flt)
    return figures.warm_hits_figure(rows), WarmHits.TABLE, rows


CHARTS: dict[str, Chart] = {
    "states": Chart(
        "Live sandboxes by state",
        "Sandboxes holding or about to hold a pod, now.",
        _states,
    ),
    "creates": Chart(
        "Creates per second",
        "Sandboxes requested: mean per second per bucket (bars) and the busiest single "
        "second (line): bursts hide in the mean.",
        _creates,
    ),
    "acquire_wait": Chart(
        "Acquisition wait, queue included",
        "What callers waited (p50, p99), with the pacer queue alone dotted; by finish time. "
        + ROLLUP_CAPTION,
        _acquire_wait,
    ),
    "ready_time": Chart(
        "Create-to-Ready over time",
        "Requested to Ready, p50 / p90 / p99 of the sandboxes Ready in each bucket. "
        + ROLLUP_CAPTION,
        _ready_time,
    ),
    "ready_hist": Chart(
        "Create-to-Ready histogram",
        "Stacked by whether the image was already on the node or had to be pulled. "
        + ROLLUP_CAPTION,
        _ready_hist,
    ),
    "ready_split": Chart(
        "Pulled vs present",
        "Create-to-Ready percentiles with the image present on the node vs pulled. "
        + ROLLUP_CAPTION,
        _ready_split,
    ),
    "warm_hits": Chart(
        "Warm-hit rate per job",
        "Successful acquisitions by source; a hit is a warm or reused sandbox.",
        _warm_hits,
    ),
}

PAGE = ChartPage(CHARTS, page_title="live", heading="Sandboxes, live", data_url=DATA_URL)

dashboard = operator_page(PAGE.page)
chart_json = operator_data(PAGE.chart_json)
chart_csv = operator_data(PAGE.chart_csv)
