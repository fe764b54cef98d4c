"""Operator pages: the live dashboard at ``/`` and its per-chart JSON and CSV endpoints.

Access: staff only (operators log in through ``/admin/login/``). The page redirects anyone
else to that login; the data endpoints answer JSON 401/403 instead, so a script gets an
error it can read, never a login page. The websocket (``sandboxes.consumers``) applies the
same rule.

Every chart is one entry of :data:`CHARTS`: a selector call (``dashboard_selectors``), a
figure (``figures``) and the table shown beside it and offered as CSV (ARCHITECTURE.md §8).
``GET /dashboard/data/<chart>.json`` returns ``{chart, title, window, figure, columns,
rows}``: the same payload the page embeds at load and refetches when a live event says
the chart changed. Bad input (``minutes`` not an integer in [1, 10080], an unknown chart)
is a JSON 4xx ``{"error", "detail"}``, never a 500. ``now`` is read here, at the edge.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import wraps
from typing import Any

from django.contrib.admin.views.decorators import staff_member_required
from django.core.serializers.json import DjangoJSONEncoder
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from sandboxes import dashboard_selectors as sel
from sandboxes import figures
from sandboxes.dashboard_rows import (
    CreateRate,
    HistogramBin,
    ImageSplit,
    LatencyBucket,
    StateCount,
    WaitBucket,
    WarmHits,
    Window,
    table,
    window_ending,
)
from sandboxes.states import SANDBOX_COLOURS
from sandman_site.errors import InvalidInput, NotFound, SandmanError

DEFAULT_MINUTES = 60
MAX_MINUTES = 7 * 24 * 60
WINDOW_CHOICES = (15, 60, 360, 1440)


@dataclass(frozen=True)
class Chart:
    title: str
    caption: str
    build: Callable[[Window], tuple[dict[str, Any], tuple[str, ...], list[Any]]]


def _states(window: Window) -> tuple[dict[str, Any], tuple[str, ...], list[Any]]:
    rows = sel.live_sandboxes_by_state()
    colours = {str(k): v for k, v in SANDBOX_COLOURS.items()}
    return figures.states_figure(rows, colours=colours), StateCount.TABLE, rows


def _creates(window: Window) -> tuple[dict[str, Any], tuple[str, ...], list[Any]]:
    rows = sel.creates_per_bucket(window=window)
    return figures.creates_figure(rows, window=window), CreateRate.TABLE, rows


def _acquire_wait(window: Window) -> tuple[dict[str, Any], tuple[str, ...], list[Any]]:
    rows = sel.acquisition_wait_over_time(window=window)
    return figures.wait_figure(rows, window=window), WaitBucket.TABLE, rows


def _ready_time(window: Window) -> tuple[dict[str, Any], tuple[str, ...], list[Any]]:
    rows = sel.ready_time_over_time(window=window)
    return figures.ready_time_figure(rows, window=window), LatencyBucket.TABLE, rows


def _ready_hist(window: Window) -> tuple[dict[str, Any], tuple[str, ...], list[Any]]:
    rows = sel.ready_time_histogram(window=window)
    return figures.ready_histogram_figure(rows), HistogramBin.TABLE, rows


def _ready_split(window: Window) -> tuple[dict[str, Any], tuple[str, ...], list[Any]]:
    rows = sel.ready_time_by_image(window=window)
    return figures.ready_split_figure(rows), ImageSplit.TABLE, rows


def _warm_hits(window: Window) -> tuple[dict[str, Any], tuple[str, ...], list[Any]]:
    rows = sel.warm_hits_by_job(window=window)
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
        "What callers waited (p50, p99), with the pacer queue alone dotted; by finish time.",
        _acquire_wait,
    ),
    "ready_time": Chart(
        "Create-to-Ready over time",
        "Requested to Ready, p50 / p90 / p99 of the sandboxes Ready in each bucket.",
        _ready_time,
    ),
    "ready_hist": Chart(
        "Create-to-Ready histogram",
        "Stacked by whether the image was already on the node or had to be pulled.",
        _ready_hist,
    ),
    "ready_split": Chart(
        "Pulled vs present",
        "Create-to-Ready percentiles with the image present on the node vs pulled.",
        _ready_split,
    ),
    "warm_hits": Chart(
        "Warm-hit rate per job",
        "Successful acquisitions by source; a hit is a warm or reused sandbox.",
        _warm_hits,
    ),
}


def _error(exc: SandmanError) -> JsonResponse:
    return JsonResponse({"error": exc.code, "detail": exc.message}, status=exc.status)


def _get_only(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            response = JsonResponse(
                {
                    "error": "method_not_allowed",
                    "detail": f"{request.method} is not allowed here; use GET.",
                },
                status=405,
            )
            response["Allow"] = "GET, HEAD"
            return response
        return view(request, *args, **kwargs)

    return wrapped


def _staff_json(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """JSON 401/403 for the data endpoints instead of a redirect to the login page."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        user = request.user
        if not user.is_authenticated:
            return JsonResponse(
                {"error": "not_authenticated", "detail": "Log in as staff at /admin/login/."},
                status=401,
            )
        if not user.is_staff:
            return JsonResponse(
                {"error": "forbidden", "detail": "The dashboards are for staff users."},
                status=403,
            )
        try:
            return view(request, *args, **kwargs)
        except SandmanError as exc:
            return _error(exc)

    return wrapped


def parse_minutes(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_MINUTES
    try:
        minutes = int(raw)
    except ValueError:
        raise InvalidInput(f"minutes must be a whole number, got {raw[:40]!r}.") from None
    if not 1 <= minutes <= MAX_MINUTES:
        raise InvalidInput(f"minutes must be between 1 and {MAX_MINUTES}, got {minutes}.")
    return minutes


def chart_payload(
    name: str, window: Window, charts: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """One chart's figure and data table; ``charts`` is the page's chart table (default: ours)."""
    charts = CHARTS if charts is None else charts
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
        "rows": table(rows, columns),
    }


def _window(request: HttpRequest) -> Window:
    return window_ending(now=timezone.now(), minutes=parse_minutes(request.GET.get("minutes")))


def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask every page's host for /favicon.ico; answer "none" instead of a 404."""
    return HttpResponse(status=204)


@_get_only
@staff_member_required
def dashboard(request: HttpRequest) -> HttpResponse:
    try:
        window = _window(request)
    except SandmanError as exc:
        return _error(exc)
    payloads = {name: chart_payload(name, window) for name in CHARTS}
    context = {
        "page_title": "live",
        "heading": "Sandboxes, live",
        # The overview's charts refresh on the page script's own event map (no refresh_on).
        "charts": [(name, chart, "") for name, chart in CHARTS.items()],
        "payloads": payloads,
        "window": window,
        "window_choices": WINDOW_CHOICES,
        "data_url": "/dashboard/data/",
    }
    return render(request, "sandboxes/charts_page.html", context)


@_get_only
@_staff_json
def chart_json(request: HttpRequest, chart: str) -> HttpResponse:
    payload = chart_payload(chart, _window(request))
    return JsonResponse(payload, encoder=DjangoJSONEncoder)


@_get_only
@_staff_json
def chart_csv(request: HttpRequest, chart: str) -> HttpResponse:
    window = _window(request)
    return csv_response(chart_payload(chart, window), chart, window)


def csv_response(payload: dict[str, Any], chart: str, window: Window) -> HttpResponse:
    """A chart's data table as a CSV download (empty cells for missing values)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(payload["columns"])
    writer.writerows(["" if cell is None else cell for cell in row] for row in payload["rows"])
    response = HttpResponse(buffer.getvalue(), content_type="text/csv; charset=utf-8")
    stamp = window.until.strftime("%Y%m%dT%H%M%SZ")
    response["Content-Disposition"] = f'attachment; filename="sandman-{chart}-{stamp}.csv"'
    return response
