"""Charts of the operations page as pure functions: rows in, Plotly figure dicts out.

Same invariants as ``figures.overview`` (both use ``figures.layout``): every trace is
always present, empty when there is no data; time axes are UTC; ``uirevision`` is constant
so a live update keeps the operator's zoom. No Django here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from dashboards.figures.incidents import PATH_COLOURS, PATH_NAMES
from dashboards.figures.layout import (
    Figure,
    chart_layout,
    time_axis,
    to_figure,
    utc_label,
    value_axis,
)
from dashboards.rows.operations import (
    AddressFailureBucket,
    AddressFailureLoad,
    IncidentClassHours,
    WarmKey,
)
from dashboards.window import Window

FAILURE_COLOUR = "#e12d39"
RIGHT_MARGIN = {"l": 56, "r": 56, "t": 28, "b": 48}


def _rate_axis(title: str, **extra: Any) -> dict[str, Any]:
    return {
        "title": {"text": title},
        "overlaying": "y",
        "side": "right",
        "rangemode": "tozero",
        "showgrid": False,
        **extra,
    }


def address_failures_figure(
    per_minute: Sequence[AddressFailureBucket],
    by_load: Sequence[AddressFailureLoad],
    *,
    window: Window | None = None,
) -> Figure:
    """Two panels: failures per minute over time (left), failures per sandbox by node
    load (right, its own axes). Sandboxes no Event told about are "unknown": shown in the
    hover text and a note, never counted as zero failures."""
    over_time = go.Bar(
        name="address failures / min",
        x=[utc_label(r.bucket_start) for r in per_minute],
        y=[round(r.failures_per_min, 3) for r in per_minute],
        width=per_minute[0].bucket_s * 1000 if per_minute else None,
        offset=0,
        text=[f"{r.unknown} unknown" if r.unknown else "" for r in per_minute],
        marker={"color": FAILURE_COLOUR},
        xaxis="x",
        yaxis="y",
    )
    by_node_load = go.Scatter(
        name="failures per sandbox by node load",
        x=[r.node_load for r in by_load],
        y=[
            None if r.failures_per_sandbox is None else round(r.failures_per_sandbox, 3)
            for r in by_load
        ],
        text=[
            f"n={r.sandboxes}" + (f", {r.unknown} unknown" if r.unknown else "") for r in by_load
        ],
        mode="lines+markers",
        line={"color": "#102a43"},
        marker={"size": 8},
        xaxis="x2",
        yaxis="y2",
    )
    left_axis = {**time_axis(window), "domain": [0.0, 0.58]}
    layout = chart_layout(
        empty=not per_minute and not by_load,
        xaxis=left_axis,
        yaxis=value_axis("failures per minute"),
        xaxis2={
            "domain": [0.7, 1.0],
            "anchor": "y2",
            "title": {"text": "node load"},
            "rangemode": "tozero",
            "dtick": 1 if len(by_load) < 12 else None,
        },
        yaxis2={**value_axis("failures per sandbox"), "anchor": "x2"},
        hovermode="closest",
    )
    unknown = sum(r.unknown for r in per_minute)
    if unknown:
        layout["annotations"] = [
            *layout.get("annotations", []),
            {
                "text": f"{unknown} sandboxes unknown (no address Event)",
                "xref": "paper",
                "yref": "paper",
                "x": 0.0,
                "y": 1.0,
                "showarrow": False,
                "font": {"size": 11, "color": "#7b8794"},
            },
        ]
    return to_figure([over_time, by_node_load], layout)


def warm_use_figure(rows: Sequence[WarmKey]) -> Figure:
    """Per (job, key): idle warm pod-hours as bars, the warm-hit rate on a second axis."""
    x = [r.label for r in rows]
    idle = go.Bar(
        name="idle warm pod-hours",
        x=x,
        y=[round(r.idle_pod_hours, 4) for r in rows],
        marker={"color": "#f0b429"},
    )
    rate = go.Scatter(
        name="warm-hit rate",
        x=x,
        y=[None if r.hit_rate is None else round(100 * r.hit_rate, 2) for r in rows],
        yaxis="y2",
        mode="markers",
        marker={"size": 11, "symbol": "diamond", "color": "#3ebd93"},
    )
    layout = chart_layout(
        empty=not rows,
        xaxis={"title": {"text": "job · key"}},
        yaxis=value_axis("idle pod-hours"),
        yaxis2=_rate_axis("warm-hit rate (%)", range=[0, 105], tickvals=[0, 25, 50, 75, 100]),
        bargap=0.4,
        hovermode="closest",
        margin=RIGHT_MARGIN,
    )
    return to_figure([idle, rate], layout)


def incident_hours_figure(rows: Sequence[IncidentClassHours]) -> Figure:
    """GPU-hours by root-cause class: the upper bound as bars, down to the lower bound as
    an error bar; one trace per path (sandbox path, outside it)."""
    traces = []
    for path in ("sandbox", "outside"):
        mine = [r for r in rows if r.path == path]
        traces.append(
            go.Bar(
                name=PATH_NAMES[path],
                x=[r.label for r in mine],
                y=[r.gpu_hours_high for r in mine],
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [0 for _ in mine],
                    "arrayminus": [r.gpu_hours_high - r.gpu_hours_low for r in mine],
                },
                text=[f"{r.cases} case{'s' if r.cases != 1 else ''}" for r in mine],
                marker={"color": PATH_COLOURS[path]},
            )
        )
    layout = chart_layout(
        empty=not rows,
        barmode="group",
        xaxis={"title": {"text": "root-cause class"}, "automargin": True},
        yaxis=value_axis("GPU-hours"),
        hovermode="closest",
    )
    return to_figure(traces, layout)
