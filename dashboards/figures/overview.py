"""Charts of the overview page as pure functions: rows in, Plotly figure dicts out (no Django).

Each function takes rows from ``dashboards.rows.overview`` and returns the JSON-ready dict
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

from collections.abc import Mapping, Sequence
from typing import Any

import plotly.graph_objects as go

from dashboards.figures.layout import (
    PERCENTILE_COLOURS,
    Figure,
    chart_layout,
    ms_to_s,
    time_axis,
    to_figure,
    utc_label,
    value_axis,
)
from dashboards.rows.overview import (
    CreateRate,
    HistogramBin,
    ImageSplit,
    LatencyBucket,
    StateCount,
    WaitBucket,
    WarmHits,
)
from dashboards.window import Window

IMAGE_COLOURS = {"present": "#3ebd93", "pulled": "#f7a35c", "unknown": "#9aa5b1"}
SOURCE_COLOURS = {"warm": "#3ebd93", "reused": "#7b61ff", "created": "#9aa5b1"}


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
    layout = chart_layout(
        empty=empty,
        xaxis={"title": {"text": "state"}},
        yaxis=value_axis("sandboxes"),
        hovermode="closest",
        showlegend=False,
    )
    return to_figure([bar], layout)


def creates_figure(rows: Sequence[CreateRate], *, window: Window | None = None) -> Figure:
    """Creates per second: the bucket's mean as bars, its busiest second as a peak line."""
    x = [utc_label(r.bucket_start) for r in rows]
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
                "x": utc_label(top.bucket_start),
                "y": top.peak_per_s,
                "text": f"peak {top.peak_per_s}/s",
                "showarrow": True,
                "arrowhead": 2,
                "xanchor": "right",  # the newest bucket sits on the right edge
                "ax": -12,
                "ay": -24,
            }
        )
    layout = chart_layout(
        empty=not rows,
        xaxis=time_axis(window),
        yaxis=value_axis("creates per second"),
        bargap=0.05,
    )
    if annotations:
        layout["annotations"] = annotations
    return to_figure([mean, peak], layout)


def _percentile_lines(
    x: list[str], series: Mapping[str, list[float | None]], *, dash: str = "solid", prefix: str = ""
) -> list[go.Scatter]:
    return [
        go.Scatter(
            name=f"{prefix}{name}",
            x=x,
            y=[ms_to_s(v) for v in values],
            mode="lines+markers",
            connectgaps=False,
            line={"color": PERCENTILE_COLOURS[name.split()[0]], "dash": dash, "width": 2},
            marker={"size": 5},
        )
        for name, values in series.items()
    ]


def ready_time_figure(rows: Sequence[LatencyBucket], *, window: Window | None = None) -> Figure:
    """Create-to-Ready p50/p90/p99 over time, one point per bucket."""
    x = [utc_label(r.bucket_start) for r in rows]
    traces = _percentile_lines(
        x,
        {
            "p50": [r.p50_ms for r in rows],
            "p90": [r.p90_ms for r in rows],
            "p99": [r.p99_ms for r in rows],
        },
    )
    layout = chart_layout(empty=not rows, xaxis=time_axis(window), yaxis=value_axis("seconds"))
    return to_figure(traces, layout)


def ready_histogram_figure(bins: Sequence[HistogramBin]) -> Figure:
    """Create-to-Ready histogram, stacked by image present on the node vs pulled."""
    centres = [ms_to_s(b.start_ms + b.width_ms / 2) for b in bins]
    width = ms_to_s(bins[0].width_ms) if bins else None
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
        x_axis["range"] = [0, ms_to_s(bins[-1].start_ms + bins[-1].width_ms)]
        x_axis["tick0"] = 0  # ticks on bin edges, not on the bars' centres
    layout = chart_layout(
        empty=not bins,
        barmode="stack",
        bargap=0.02,
        xaxis=x_axis,
        yaxis=value_axis("sandboxes"),
        hovermode="closest",
    )
    return to_figure(traces, layout)


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
                y=[ms_to_s(row.p50_ms), ms_to_s(row.p90_ms), ms_to_s(row.p99_ms)] if row else [],
                marker={"color": IMAGE_COLOURS[name]},
            )
        )
    layout = chart_layout(
        empty=not rows,
        barmode="group",
        xaxis={"title": {"text": "percentile"}},
        yaxis=value_axis("seconds"),
        hovermode="closest",
    )
    return to_figure(traces, layout)


def wait_figure(rows: Sequence[WaitBucket], *, window: Window | None = None) -> Figure:
    """Acquisition wait (queue included) p50/p99, with the pacer queue alone dashed."""
    x = [utc_label(r.bucket_start) for r in rows]
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
    layout = chart_layout(empty=not rows, xaxis=time_axis(window), yaxis=value_axis("seconds"))
    return to_figure(traces, layout)


def warm_hits_figure(rows: Sequence[WarmHits]) -> Figure:
    """Acquisitions per job by source (stacked), with the warm-hit rate on a second axis."""
    x = [r.job_name if r.job_id is None else f"{r.job_name} (#{r.job_id})" for r in rows]
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
    layout = chart_layout(
        empty=not rows,
        barmode="stack",
        xaxis={"title": {"text": "job"}},
        yaxis=value_axis("acquisitions"),
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
    return to_figure(traces, layout)
