"""The incidents pages: the latest cases at ``/incidents/``, the GPU-hour accounting
(Table A49) at ``/incidents/accounting/`` and its CSV.

Access is the operator pages' one rule (``dashboards.access``: active staff); the CSV goes
through the one export helper (``dashboards.export``). Numbers come from
``incidents.selectors.accounting`` (aggregated in the database, shared with the REST API)
laid out by ``selectors.incidents``; charts from ``figures.incidents``, embedded with
``include_plotlyjs=False``: Plotly's JS is served locally from ``/static/plotly/``.
"""

from __future__ import annotations

from decimal import Decimal

import plotly.io as pio
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboards.access import operator_data, operator_page
from dashboards.export import cells, csv_response
from dashboards.figures import incidents as figures
from dashboards.rows.incidents import AccountingLine
from dashboards.selectors import incidents as sel
from incidents import selectors as accounting
from incidents.models import Incident
from incidents.selectors import Accounting, Bounds
from incidents.states import INCIDENT_COLOURS

CSV_FILENAME = "incident-accounting.csv"
NO_ACCOUNT = "—"


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


def case_hours(incident: Incident) -> str:
    """One incident's GPU-hour range, or a dash when it has no account."""
    low, high = incident.gpu_hours_low, incident.gpu_hours_high
    if not incident.has_account or low is None or high is None:
        return NO_ACCOUNT
    return fmt_range(Bounds(low, high, 1))


@operator_page
def index_page(request: HttpRequest) -> HttpResponse:
    index = sel.incident_index()
    colours = {str(k): v for k, v in INCIDENT_COLOURS.items()}
    rows = [
        (incident, colours.get(incident.status, "#000"), case_hours(incident))
        for incident in index.latest
    ]
    context = {"rows": rows, "total": index.total, "open_drafts": index.open_drafts}
    return render(request, "dashboards/incidents/index.html", context)


@operator_page
def accounting_page(request: HttpRequest) -> HttpResponse:
    acc = accounting.accounting()
    class_html, workload_html = _figures(acc)
    context = {
        "class_chart": class_html,
        "workload_chart": workload_html,
        "by_class": [(r, fmt_range(r.bounds)) for r in acc.by_class],
        "by_workload": [(r, fmt_range(r.bounds)) for r in acc.by_workload],
        "totals": {k: (v, fmt_range(v)) for k, v in acc.totals.items()},
        "cases": [(c, case_hours(c)) for c in acc.cases],
        "flagged": accounting.accounting_flagged(acc),
        "path_names": figures.PATH_NAMES,
    }
    return render(request, "dashboards/incidents/accounting.html", context)


@operator_data
def accounting_csv(request: HttpRequest) -> HttpResponse:
    lines = sel.accounting_lines(accounting.accounting())
    return csv_response(
        AccountingLine.TABLE, cells(lines, AccountingLine.TABLE), filename=CSV_FILENAME
    )
