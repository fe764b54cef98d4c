"""Operator pages of the incidents app: the latest cases, the GPU-hour accounting
(Table A49) and its CSV.

Login required (the admin's login page). Numbers come from
``incidents.selectors.accounting`` (aggregated in the database); charts from
``incidents.figures``; Plotly's JS is served locally from ``/static/plotly/``.
"""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import plotly.io as pio
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from incidents import figures, selectors
from incidents.selectors import Accounting, Bounds
from incidents.states import INCIDENT_COLOURS, IncidentStatus

INDEX_ROWS = 200


def fmt_hours(value: Decimal) -> str:
    if value == value.to_integral_value():
        return f"{int(value):,}"
    return f"{value:,.1f}"


def fmt_range(bounds: Bounds) -> str:
    low, high = fmt_hours(bounds.low), fmt_hours(bounds.high)
    return low if low == high else f"{low}–{high}"


def _figures(acc: Accounting) -> tuple[str, str]:
    by_class = figures.range_bars(
        [
            figures.BarRow(r.path, r.label, float(r.bounds.low), float(r.bounds.high))
            for r in acc.by_class
        ],
    )
    by_workload = figures.range_bars(
        [
            figures.BarRow(r.path, r.workload, float(r.bounds.low), float(r.bounds.high))
            for r in acc.by_workload
        ],
    )
    config = {"displaylogo": False, "responsive": True}
    return (
        pio.to_html(
            by_class,
            include_plotlyjs=False,
            full_html=False,
            div_id="accounting-by-class",
            config=config,
        ),
        pio.to_html(
            by_workload,
            include_plotlyjs=False,
            full_html=False,
            div_id="accounting-by-workload",
            config=config,
        ),
    )


@login_required
def index_page(request: HttpRequest) -> HttpResponse:
    qs = selectors.incident_recent()
    rows = [
        (
            incident,
            INCIDENT_COLOURS.get(incident.status, "#000"),
            fmt_range(Bounds(incident.gpu_hours_low, incident.gpu_hours_high, 1))
            if incident.has_account
            else "—",
        )
        for incident in qs[:INDEX_ROWS]
    ]
    context = {
        "rows": rows,
        "total": qs.count(),
        "open_drafts": qs.filter(status=IncidentStatus.OPEN).exclude(detector_key="").count(),
    }
    return render(request, "incidents/index.html", context)


@login_required
def accounting_page(request: HttpRequest) -> HttpResponse:
    acc = selectors.accounting()
    class_html, workload_html = _figures(acc)
    context = {
        "class_chart": class_html,
        "workload_chart": workload_html,
        "by_class": [(r, fmt_range(r.bounds)) for r in acc.by_class],
        "by_workload": [(r, fmt_range(r.bounds)) for r in acc.by_workload],
        "totals": {k: (v, fmt_range(v)) for k, v in acc.totals.items()},
        "cases": [(c, fmt_range(Bounds(c.gpu_hours_low, c.gpu_hours_high, 1))) for c in acc.cases],
        "flagged": selectors.accounting_flagged(acc),
        "path_names": figures.PATH_NAMES,
    }
    return render(request, "incidents/accounting.html", context)


@login_required
def accounting_csv(request: HttpRequest) -> HttpResponse:
    acc = selectors.accounting()
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["table", "path", "group", "gpu_hours_low", "gpu_hours_high", "cases"])
    for r in acc.by_class:
        writer.writerow(["class", r.path, r.label, r.bounds.low, r.bounds.high, r.bounds.cases])
    for r in acc.by_workload:
        writer.writerow(
            ["workload", r.path, r.workload, r.bounds.low, r.bounds.high, r.bounds.cases]
        )
    for key, b in acc.totals.items():
        writer.writerow(["total", key, "", b.low, b.high, b.cases])
    response = HttpResponse(out.getvalue(), content_type="text/csv")
    response["Content-Disposition"] = 'attachment; filename="incident-accounting.csv"'
    return response
