"""The free-address chart of ``/operations/``: rows in, a Plotly figure dict out.

One line per subnet (its lowest reading per bucket), the floor as a dashed line, and a
marker where the pool stopped or resumed creating. The floor and marker traces are always
present (empty without data), as is one free-address trace when no subnet was read.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from dashboards.figures.layout import (
    Figure,
    chart_layout,
    time_axis,
    to_figure,
    utc_label,
    value_axis,
)
from dashboards.rows.addresses import FloorChangeRow, SubnetFreeBucket
from dashboards.window import Window

STOPPED_COLOUR = "#8e44ad"


def free_addresses_figure(
    buckets: Sequence[SubnetFreeBucket],
    changes: Sequence[FloorChangeRow],
    *,
    window: Window | None = None,
) -> Figure:
    subnets: dict[str, list[SubnetFreeBucket]] = {}
    for row in buckets:
        subnets.setdefault(row.subnet_id, []).append(row)
    lines = [
        go.Scatter(
            name=f"{subnet} ({rows[0].zone})" if rows[0].zone else subnet,
            x=[utc_label(r.bucket_start) for r in rows],
            y=[r.min_available for r in rows],
            mode="lines+markers",
        )
        for subnet, rows in sorted(subnets.items())
    ] or [go.Scatter(name="free addresses", x=[], y=[], mode="lines")]
    floor = go.Scatter(
        name="floor",
        x=[utc_label(r.bucket_start) for r in buckets],
        y=[r.floor for r in buckets],
        mode="lines",
        line={"dash": "dash", "color": "#e12d39"},
    )
    marks = go.Scatter(
        name="creates stopped / resumed",
        x=[utc_label(c.at) for c in changes],
        y=[c.available for c in changes],
        text=[
            f"{'stopped' if c.closed else 'resumed'}: {c.subnet_id} {c.available} free "
            f"(floor {c.floor})"
            for c in changes
        ],
        mode="markers",
        marker={
            "size": 12,
            "color": STOPPED_COLOUR,
            "symbol": ["x" if c.closed else "circle-open" for c in changes],
        },
    )
    layout = chart_layout(
        empty=not buckets and not changes,
        xaxis=time_axis(window),
        yaxis=value_axis("free pod addresses"),
        hovermode="closest",
    )
    return to_figure([*lines, floor, marks], layout)
