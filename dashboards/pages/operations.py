"""The operations page at ``/operations/``: address failures, free pod addresses per
subnet (and where the address floor stopped creates), warm-pool use, incident GPU-hours.

A second live page beside the overview (``pages.overview``), built by the same machinery
(``pages.charts``) under the same access rule (``dashboards.access``): data at
``/operations/data/<chart>.csv|json``. Each chart's ``refresh_on`` lists the live event
kinds that change it (the page script refetches only those charts).
"""

from __future__ import annotations

from dashboards.access import operator_data, operator_page
from dashboards.figures import addresses as address_figures
from dashboards.figures import operations as figures
from dashboards.filters import ChartFilter
from dashboards.pages.charts import Chart, ChartPage, ChartTable
from dashboards.rows.addresses import SubnetFreeBucket
from dashboards.rows.operations import (
    AddressFailureRow,
    IncidentClassHours,
    WarmKey,
    address_failure_table,
)
from dashboards.selectors import addresses as address_sel
from dashboards.selectors import operations as sel

DATA_URL = "/operations/data/"


def _address_failures(flt: ChartFilter) -> ChartTable:
    per_minute = sel.address_failures_per_minute(flt)
    by_load = sel.address_failures_by_node_load(flt)
    figure = figures.address_failures_figure(per_minute, by_load, window=flt.window)
    return figure, AddressFailureRow.TABLE, address_failure_table(per_minute, by_load)


def _free_addresses(flt: ChartFilter) -> ChartTable:
    buckets = address_sel.subnet_free_per_bucket(flt)
    changes = address_sel.floor_changes(flt)
    figure = address_figures.free_addresses_figure(buckets, changes, window=flt.window)
    return figure, SubnetFreeBucket.TABLE, buckets


def _warm_use(flt: ChartFilter) -> ChartTable:
    rows = sel.warm_use_by_job_key(flt)
    return figures.warm_use_figure(rows), WarmKey.TABLE, rows


def _incident_hours(flt: ChartFilter) -> ChartTable:
    rows = sel.incident_gpu_hours_by_class()
    return figures.incident_hours_figure(rows), IncidentClassHours.TABLE, rows


CHARTS: dict[str, Chart] = {
    "address_failures": Chart(
        "Address failures",
        "Left: failures per minute, by when the sandbox was scheduled (else requested). "
        "Right: failures per sandbox by node load, approximated as the sandboxes requested "
        "on the same node in the same bucket.",
        _address_failures,
        refresh_on=("sandbox.state", "sandbox"),
    ),
    "free_addresses": Chart(
        "Free pod addresses per subnet",
        "Lowest reading per bucket of each subnet's free addresses (AvailableIpAddressCount); "
        "dashed: the floor under which the pool stops creating (SANDMAN_ADDRESS_FLOOR); "
        "markers: where creates stopped (x) and resumed (o).",
        _free_addresses,
        refresh_on=("address.floor",),
    ),
    "warm_use": Chart(
        "Warm-hit rate and idle warm pod-hours",
        "Per job and key: share of successful acquisitions served warm or reused, and the "
        "hours warm pods sat Ready before being handed out or deleted (inside the window).",
        _warm_use,
        refresh_on=("sandbox.state", "sandbox", "acquisition", "job.state"),
    ),
    "incident_hours": Chart(
        "Incident GPU-hours by root-cause class",
        "Table A49: all recorded incidents with a GPU-hour account, one case per job; bar "
        "at the upper bound, whisker down to the lower.",
        _incident_hours,
        refresh_on=("incident_opened", "incident.state", "incident"),
    ),
}


PAGE = ChartPage(CHARTS, page_title="operations", heading="Operations, live", data_url=DATA_URL)

operations = operator_page(PAGE.page)
chart_json = operator_data(PAGE.chart_json)
chart_csv = operator_data(PAGE.chart_csv)
