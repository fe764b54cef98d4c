"""The operations page at ``/operations/`` and its per-chart JSON and CSV endpoints.

A second live page beside the overview (``sandboxes.pages``), built the same way and with
the same rules, whose helpers it reuses: staff only (the page redirects to the admin
login, the data endpoints answer JSON 401/403/405), ``minutes`` validated the same way,
``now`` read here at the edge, payload ``{chart, title, window, figure, columns, rows}``.
``static/sandman/dashboard.js`` draws it: the page sets ``data-data-url`` on ``<body>`` so
refetches go to ``/operations/data/``, and each chart's ``data-refresh-on`` lists the live
event kinds that change it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from sandboxes import operations_figures as figures
from sandboxes import operations_selectors as sel
from sandboxes import pages
from sandboxes.dashboard_rows import Window
from sandboxes.operations_rows import (
    AddressFailureRow,
    IncidentClassHours,
    WarmKey,
    address_failure_table,
)
from sandboxes.pages import WINDOW_CHOICES, Chart, _error, _get_only, _staff_json, _window
from sandman_site.errors import SandmanError

DATA_URL = "/operations/data/"


@dataclass(frozen=True)
class OperationsChart(Chart):
    refresh_on: tuple[str, ...] = ()


def _address_failures(window: Window) -> tuple[dict[str, Any], tuple[str, ...], list[Any]]:
    per_minute = sel.address_failures_per_minute(window=window)
    by_load = sel.address_failures_by_node_load(window=window)
    figure = figures.address_failures_figure(per_minute, by_load, window=window)
    return figure, AddressFailureRow.TABLE, address_failure_table(per_minute, by_load)


def _warm_use(window: Window) -> tuple[dict[str, Any], tuple[str, ...], list[Any]]:
    rows = sel.warm_use_by_job_key(window=window)
    return figures.warm_use_figure(rows), WarmKey.TABLE, rows


def _incident_hours(window: Window) -> tuple[dict[str, Any], tuple[str, ...], list[Any]]:
    rows = sel.incident_gpu_hours_by_class()
    return figures.incident_hours_figure(rows), IncidentClassHours.TABLE, rows


CHARTS: dict[str, OperationsChart] = {
    "address_failures": OperationsChart(
        "Address failures",
        "Left: failures per minute, by when the sandbox was scheduled (else requested). "
        "Right: failures per sandbox by node load, approximated as the sandboxes requested "
        "on the same node in the same bucket.",
        _address_failures,
        refresh_on=("sandbox.state", "sandbox"),
    ),
    "warm_use": OperationsChart(
        "Warm-hit rate and idle warm pod-hours",
        "Per job and key: share of successful acquisitions served warm or reused, and the "
        "hours warm pods sat Ready before being handed out or deleted (inside the window).",
        _warm_use,
        refresh_on=("sandbox.state", "sandbox", "acquisition", "job.state"),
    ),
    "incident_hours": OperationsChart(
        "Incident GPU-hours by root-cause class",
        "Table A49: all recorded incidents with a GPU-hour account, one case per job; bar "
        "at the upper bound, whisker down to the lower.",
        _incident_hours,
        refresh_on=("incident_opened", "incident.state", "incident"),
    ),
}


def chart_payload(name: str, window: Window) -> dict[str, Any]:
    return pages.chart_payload(name, window, CHARTS)


@_get_only
@staff_member_required
def operations(request: HttpRequest) -> HttpResponse:
    try:
        window = _window(request)
    except SandmanError as exc:
        return _error(exc)
    context = {
        "page_title": "operations",
        "heading": "Operations, live",
        "charts": [(name, chart, " ".join(chart.refresh_on)) for name, chart in CHARTS.items()],
        "payloads": {name: chart_payload(name, window) for name in CHARTS},
        "window": window,
        "window_choices": WINDOW_CHOICES,
        "data_url": DATA_URL,
    }
    return render(request, "sandboxes/charts_page.html", context)


@_get_only
@_staff_json
def chart_json(request: HttpRequest, chart: str) -> HttpResponse:
    return JsonResponse(chart_payload(chart, _window(request)), encoder=DjangoJSONEncoder)


@_get_only
@_staff_json
def chart_csv(request: HttpRequest, chart: str) -> HttpResponse:
    window = _window(request)
    return pages.csv_response(chart_payload(chart, window), chart, window)
