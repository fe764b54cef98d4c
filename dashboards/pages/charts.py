"""A live page of charts (the overview and the operations page): the page and its data.

A page is a :class:`ChartPage` over a table of :class:`Chart` entries: a selector call, a
figure and the table shown beside it and offered as CSV and JSON. ``<data_url><chart>.json``
answers ``{chart, title, window, filter, figure, columns, rows}``: the same payload the page embeds
at load and refetches when a live event says the chart changed
(``static/sandman/dashboard.js``; the page puts ``data_url`` on ``<body>`` and each chart's
``refresh_on`` event kinds on its element; empty means the script's own event map).

Every view of a page is one :class:`~dashboards.filters.ChartFilter` parsed from the query
string (time range, jobs, backend, top N); each chart's build receives it and hands it to its
selectors, and every link of the page (window choices, CSV, JSON, the script's refetches)
carries the same query string, so a view can be shared by its URL.

Rules a reader must not break: ``now`` is read here, at the edge, once per request (the
selectors take the filter and its :class:`~dashboards.window.Window`); the views are wrapped by
``dashboards.access`` where they are exposed (the page modules), so bad input is a JSON
4xx; exports go through ``dashboards.export``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from dashboards.export import cells, csv_response, json_response, stamped_filename
from dashboards.figures.layout import Figure
from dashboards.filters import BACKENDS, ChartFilter, parse_filter
from dashboards.window import WINDOW_CHOICES
from sandman_site.errors import NotFound

TEMPLATE = "dashboards/charts_page.html"

# What a chart's build returns: its figure, its table's columns and the rows of that table.
ChartTable = tuple[Figure, tuple[str, ...], Sequence[Any]]


@dataclass(frozen=True)
class Chart:
    title: str
    caption: str
    build: Callable[[ChartFilter], ChartTable]
    # Live event kinds that change this chart (blank: the page script's own event map).
    refresh_on: tuple[str, ...] = ()


def request_filter(request: HttpRequest) -> ChartFilter:
    """The view the query string asks for, ending now (``InvalidInput`` for a bad value)."""
    return parse_filter(request.GET, now=timezone.now())


def chart_payload(name: str, flt: ChartFilter, charts: Mapping[str, Chart]) -> dict[str, Any]:
    """One chart's figure and data table (``NotFound`` for a name not in ``charts``)."""
    chart = charts.get(name)
    if chart is None:
        raise NotFound(f"No chart named {name[:60]!r}; known: {', '.join(charts)}.")
    figure, columns, rows = chart.build(flt)
    window = flt.window
    return {
        "chart": name,
        "title": chart.title,
        "window": {
            "since": window.since,
            "until": window.until,
            "bucket_s": window.bucket_s,
            "minutes": window.minutes,
        },
        "filter": {
            "jobs": list(flt.job_ids),
            "backend": flt.backend,
            "top": flt.top,
            "query": flt.query(),
        },
        "figure": figure,
        "columns": list(columns),
        "rows": cells(rows, columns),
    }


@dataclass(frozen=True)
class ChartPage:
    """One live page: every chart drawn at load, then each one's JSON and CSV on demand."""

    charts: Mapping[str, Chart]
    page_title: str
    heading: str
    data_url: str

    def payload(self, name: str, flt: ChartFilter) -> dict[str, Any]:
        return chart_payload(name, flt, self.charts)

    def page(self, request: HttpRequest) -> HttpResponse:
        flt = request_filter(request)
        window = flt.window
        context = {
            "page_title": self.page_title,
            "heading": self.heading,
            "charts": [
                (name, chart, " ".join(chart.refresh_on)) for name, chart in self.charts.items()
            ],
            "payloads": {name: self.payload(name, flt) for name in self.charts},
            "window": window,
            "filter": flt,
            "query": flt.query(),
            "window_choices": [(m, flt.query(minutes=str(m))) for m in WINDOW_CHOICES],
            "backends": BACKENDS,
            "jobs_text": ",".join(str(j) for j in flt.job_ids),
            "since_text": flt.window.since.strftime("%Y-%m-%dT%H:%M"),
            "until_text": flt.window.until.strftime("%Y-%m-%dT%H:%M"),
            "data_url": self.data_url,
        }
        return render(request, TEMPLATE, context)

    def chart_json(self, request: HttpRequest, chart: str) -> HttpResponse:
        return json_response(self.payload(chart, request_filter(request)))

    def chart_csv(self, request: HttpRequest, chart: str) -> HttpResponse:
        flt = request_filter(request)
        payload = self.payload(chart, flt)
        return csv_response(
            payload["columns"],
            payload["rows"],
            filename=stamped_filename(chart, flt.window.until),
        )
