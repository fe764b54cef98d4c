"""Dashboard charts as pure functions: rows in, Plotly figure dicts out (no Django here).

Each function takes rows from ``sandboxes.dashboard_rows`` and returns the JSON-ready dict
``{"data": [...], "layout": {...}}`` that ``Plotly.newPlot``/``Plotly.react`` take; the page
loads Plotly's JS locally (``include_plotlyjs=False`` in spirit: the server never embeds it).
Figures are built through ``plotly.graph_objects`` so a misspelt property fails here, in a
test, not silently in the browser.

Invariants the page and tests rely on:
* Every trace is always present, with empty ``x``/``y`` when there is no data (the page
  and ``Plotly.react`` address traces by position); an empty figure says so in a note.
* Time axes are UTC, written ``YYYY-MM-DD HH:MM:SS`` (Plotly reads them as dates).
* Durations are drawn in seconds (tables and CSV keep milliseconds).
* ``layout.uirevision`` is constant, so a live update keeps the operator's zoom.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

try:
    # Plotly's validators read numpy from sys.modules without the import lock, so the first
    # figures built in two request threads at once can meet a half-imported numpy
    # ("partially initialized module 'numpy'"). Import it once, here, before any thread.
    import numpy  # noqa: F401
except ImportError:  # plotly works without numpy, and then there is nothing to race on
    pass

from sandboxes.dashboard_rows import (
    CreateRate,
    HistogramBin,
    ImageSplit,
    LatencyBucket,
    StateCount,
    WaitBucket,
    WarmHits,
    Window,
)

Figure = dict[str, Any]

PERCENTILE_COLOURS = {"p50": "#2186eb", "p90": "#f0b429", "p99": "#e12d39"}
IMAGE_COLOURS = {"present": "#3ebd93", "pulled": "#f7a35c", "unknown": "#9aa5b1"}
SOURCE_COLOURS = {"warm": "#3ebd93", "reused": "#7b61ff", "created": "#9aa5b1"}
EMPTY_NOTE = "No data in this window"


def _ts(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def _layout(*, empty: bool, **extra: Any) -> dict[str, Any]:
    layout: dict[str, Any] = {
        "template": "none",
        "height": 300,
        "margin": {"l": 56, "r": 16, "t": 28, "b": 48},
        "font": {"family": "system-ui, -apple-system, Segoe UI, sans-serif", "size": 12},
        "legend": {"orientation": "h", "x": 0, "y": 1.12, "traceorder": "normal"},
        "hovermode": "x unified",
        "uirevision": "keep",
        "paper_bgcolor": "#ffffff",
        "plot_bgcolor": "#ffffff",
    }
    layout.update(extra)
    if empty:
        for name in ("xaxis", "yaxis", "yaxis2"):
            axis = layout.get(name)
            if isinstance(axis, dict) and axis.get("type") != "date":
                # No data: category and value ticks would be Plotly's placeholders.
                layout[name] = {**axis, "showticklabels": False}
        layout["annotations"] = [
            {
                "text": EMPTY_NOTE,
                "xref": "paper",
                "yref": "paper",
                "x": 0.5,
                "y": 0.5,
                "showarrow": False,
                "font": {"size": 14, "color": "#7b8794"},
            }
        ]
    return layout


def _time_axis(window: Window | None) -> dict[str, Any]:
    axis: dict[str, Any] = {"type": "date", "title": {"text": "time (UTC)"}, "gridcolor": "#e4e7eb"}
    if window is not None:
        axis["range"] = [_ts(window.since), _ts(window.until)]
    return axis


def _value_axis(title: str, **extra: Any) -> dict[str, Any]:
    return {"title": {"text": title}, "rangemode": "tozero", "gridcolor": "#e4e7eb", **extra}


def _figure(data: list[Any], layout: dict[str, Any]) -> Figure:
    return go.Figure(data=data, layout=layout).to_plotly_json()


def states_figure(rows: Sequence[StateCount], *, colours: Mapping[str, str]) -> Figure:
    """Live sandboxes by state: one bar per state, coloured like the state."""
    bar = go.Bar(
        name="sandboxes",
        x=[r.state for r in rows],
        y=[r.count for r in rows],
        marker={"color": [colours.get(r.state, "#9aa5b1") for r in rows]},
        text=[str(r.count) for r in rows],
        textposition="outside",
        hovertemplate="%{x}: %{y}<extra></extra>",
    )
    empty = not any(r.count for r in rows)
    layout = _layout(
        empty=empty,
        xaxis={"title": {"text": "state"}},
        yaxis=_value_axis("sandboxes"),
        hovermode="closest",
        showlegend=False,
    )
    return _figure([bar], layout)


def creates_figure(rows: Sequence[CreateRate], *, window: Window | None = None) -> Figure:
    """Creates per second: the bucket's mean as bars, its busiest second as a peak line."""
    x = [_ts(r.bucket_start) for r in rows]
    width_ms = rows[0].bucket_s * 1000 if rows else None
    mean = go.Bar(
        name="mean creates/s",
        x=x,
        y=[round(r.mean_per_s, 3) for r in rows],
        width=width_ms,
        offset=0,
        marker={"color": "#9fb3c8"},
    )
    peak = go.Scatter(
        name="peak second (burst)",
        x=x,
        y=[r.peak_per_s for r in rows],
        mode="lines+markers",
        line={"color": "#e12d39", "width": 1.5},
        marker={"size": 6},
    )
    annotations = []
    if rows:
        top = max(rows, key=lambda r: (r.peak_per_s, r.bucket_start))
        annotations.append(
            {
                "x": _ts(top.bucket_start),
                "y": top.peak_per_s,
                "text": f"peak {top.peak_per_s}/s",
                "showarrow": True,
                "arrowhead": 2,
                "xanchor": "right",  # the newest bucket sits on the right edge
                "ax": -12,
                "ay": -24,
            }
        )
    layout = _layout(
        empty=not rows,
        xaxis=_time_axis(window),
        yaxis=_value_axis("creates per second"),
        bargap=0.05,
    )
    if annotations:
        layout["annotations"] = annotations
    return _figure([mean, peak], layout)


def _percentile_lines(
    x: list[str], series: Mapping[str, list[float | None]], *, dash: str = "solid", prefix: str = ""
) -> list[go.Scatter]:
    return [
        go.Scatter(
            name=f"{prefix}{name}",
            x=x,
            y=[_s(v) for v in values],
            mode="lines+markers",
            connectgaps=False,
            line={"color": PERCENTILE_COLOURS[name.split()[0]], "dash": dash, "width": 2},
            marker={"size": 5},
        )
        for name, values in series.items()
    ]


def ready_time_figure(rows: Sequence[LatencyBucket], *, window: Window | None = None) -> Figure:
    """Create-to-Ready p50/p90/p99 over time, one point per bucket."""
    x = [_ts(r.bucket_start) for r in rows]
    traces = _percentile_lines(
        x,
        {
            "p50": [r.p50_ms for r in rows],
            "p90": [r.p90_ms for r in rows],
            "p99": [r.p99_ms for r in rows],
        },
    )
    layout = _layout(empty=not rows, xaxis=_time_axis(window), yaxis=_value_axis("seconds"))
    return _figure(traces, layout)


def ready_histogram_figure(bins: Sequence[HistogramBin]) -> Figure:
    """Create-to-Ready histogram, stacked by image present on the node vs pulled."""
    centres = [_s(b.start_ms + b.width_ms / 2) for b in bins]
    width = _s(bins[0].width_ms) if bins else None
    traces = [
        go.Bar(
            name=name,
            x=centres,
            y=[getattr(b, name) for b in bins],
            width=width,
            marker={"color": IMAGE_COLOURS[name]},
        )
        for name in ("present", "pulled", "unknown")
    ]
    x_axis: dict[str, Any] = {"title": {"text": "create-to-Ready (s)"}, "rangemode": "tozero"}
    if bins:
        x_axis["range"] = [0, _s(bins[-1].start_ms + bins[-1].width_ms)]
        x_axis["tick0"] = 0  # ticks on bin edges, not on the bars' centres
    layout = _layout(
        empty=not bins,
        barmode="stack",
        bargap=0.02,
        xaxis=x_axis,
        yaxis=_value_axis("sandboxes"),
        hovermode="closest",
    )
    return _figure(traces, layout)


def ready_split_figure(rows: Sequence[ImageSplit]) -> Figure:
    """Create-to-Ready percentiles, image already on the node vs pulled, side by side."""
    by_image = {r.image: r for r in rows}
    traces = []
    for name in ("present", "pulled", "unknown"):
        row = by_image.get(name)
        traces.append(
            go.Bar(
                name=f"{name} (n={row.n})" if row else name,
                x=["p50", "p90", "p99"] if row else [],
                y=[_s(row.p50_ms), _s(row.p90_ms), _s(row.p99_ms)] if row else [],
                marker={"color": IMAGE_COLOURS[name]},
            )
        )
    layout = _layout(
        empty=not rows,
        barmode="group",
        xaxis={"title": {"text": "percentile"}},
        yaxis=_value_axis("seconds"),
        hovermode="closest",
    )
    return _figure(traces, layout)


def wait_figure(rows: Sequence[WaitBucket], *, window: Window | None = None) -> Figure:
    """Acquisition wait (queue included) p50/p99, with the pacer queue alone dashed."""
    x = [_ts(r.bucket_start) for r in rows]
    traces = _percentile_lines(
        x,
        {"p50": [r.wait_p50_ms for r in rows], "p99": [r.wait_p99_ms for r in rows]},
        prefix="wait ",
    ) + _percentile_lines(
        x,
        {"p50": [r.queue_p50_ms for r in rows], "p99": [r.queue_p99_ms for r in rows]},
        dash="dot",
        prefix="queue ",
    )
    layout = _layout(empty=not rows, xaxis=_time_axis(window), yaxis=_value_axis("seconds"))
    return _figure(traces, layout)


def warm_hits_figure(rows: Sequence[WarmHits]) -> Figure:
    """Acquisitions per job by source (stacked), with the warm-hit rate on a second axis."""
    x = [f"{r.job_name} (#{r.job_id})" for r in rows]
    traces: list[Any] = [
        go.Bar(
            name=name,
            x=x,
            y=[getattr(r, name) for r in rows],
            marker={"color": SOURCE_COLOURS[name]},
        )
        for name in ("warm", "reused", "created")
    ]
    traces.append(
        go.Scatter(
            name="warm-hit rate",
            x=x,
            y=[None if r.hit_rate is None else round(100 * r.hit_rate, 2) for r in rows],
            yaxis="y2",
            mode="markers",
            marker={"size": 11, "symbol": "diamond", "color": "#102a43"},
        )
    )
    layout = _layout(
        empty=not rows,
        barmode="stack",
        xaxis={"title": {"text": "job"}},
        yaxis=_value_axis("acquisitions"),
        yaxis2={
            "title": {"text": "warm-hit rate (%)"},
            "overlaying": "y",
            "side": "right",
            "range": [0, 105],
            "tickvals": [0, 25, 50, 75, 100],
            "showgrid": False,
        },
        bargap=0.4,
        hovermode="closest",
        margin={"l": 56, "r": 56, "t": 28, "b": 48},
    )
    return _figure(traces, layout)
