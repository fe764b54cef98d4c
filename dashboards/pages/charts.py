"""A live page of charts (the overview and the operations page): the page and its data.

A page is a :class:`ChartPage` over a table of :class:`Chart` entries: a selector call, a
figure and the table shown beside it and offered as CSV and JSON. ``<data_url><chart>.json``
answers ``{chart, title, window, figure, columns, rows}``: the same payload the page embeds
at load and refetches when a live event says the chart changed
(``static/sandman/dashboard.js``; the page puts ``data_url`` on ``<body>`` and each chart's
``refresh_on`` event kinds on its element; empty means the script's own event map).

Rules a reader must not break: ``now`` is read here, at the edge, once per request (the
selectors take the :class:`~dashboards.window.Window`); the views are wrapped by
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
from dashboards.window import WINDOW_CHOICES, Window, parse_minutes, window_ending
from sandman_site.errors import NotFound

TEMPLATE = "dashboards/charts_page.html"

# What a chart's build returns: its figure, its table's columns and the rows of that table.
ChartTable = tuple[Figure, tuple[str, ...], Sequence[Any]]


@dataclass(frozen=True)
class Chart:
    title: str
    caption: str
    build: Callable[[Window], ChartTable]
    # Live event kinds that change this chart (blank: the page script's own event map).
    refresh_on: tuple[str, ...] = ()


def request_window(request: HttpRequest) -> Window:
    """The window of ``?minutes=`` ending now (``InvalidInput`` for a bad value)."""
    return window_ending(now=timezone.now(), minutes=parse_minutes(request.GET.get("minutes")))


def chart_payload(name: str, window: Window, charts: Mapping[str, Chart]) -> dict[str, Any]:
    """One chart's figure and data table (``NotFound`` for a name not in ``charts``)."""
    chart = charts.get(name)
    if chart is None:
        raise NotFound(f"No chart named {name[:60]!r}; known: {', '.join(charts)}.")
    figure, columns, rows = chart.build(window)
    return {
        "chart": name,
        "title": chart.title,
        "window": {
            "since": window.since,
            "until": window.until,
            "bucket_s": window.bucket_s,
            "minutes": window.minutes,
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

    def payload(self, name: str, window: Window) -> dict[str, Any]:
        return chart_payload(name, window, self.charts)

    def page(self, request: HttpRequest) -> HttpResponse:
        window = request_window(request)
        context = {
            "page_title": self.page_title,
            "heading": self.heading,
            "charts": [
                (name, chart, " ".join(chart.refresh_on)) for name, chart in self.charts.items()
            ],
            "payloads": {name: self.payload(name, window) for name in self.charts},
            "window": window,
            "window_choices": WINDOW_CHOICES,
            "data_url": self.data_url,
        }
        return render(request, TEMPLATE, context)

    def chart_json(self, request: HttpRequest, chart: str) -> HttpResponse:
        return json_response(self.payload(chart, request_window(request)))

    def chart_csv(self, request: HttpRequest, chart: str) -> HttpResponse:
        window = request_window(request)
        payload = self.payload(chart, window)
        return csv_response(
            payload["columns"], payload["rows"], filename=stamped_filename(chart, window.until)
        )
