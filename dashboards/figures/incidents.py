"""Charts of the incident accounting page (Table A49): rows in, Plotly figure out (no Django,
no I/O). The operations page's GPU-hour chart uses the same path names and colours.

Bars show the upper bound of summed GPU-hours; a one-sided error bar reaches down to the
lower bound, so a range ``low–high`` reads as one bar. One trace per path (sandbox path,
outside it), so the two sums the paper keeps apart never stack.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import plotly.graph_objects as go

PATH_NAMES = {"sandbox": "sandbox path", "outside": "outside the sandbox path"}
PATH_COLOURS = {"sandbox": "#2186eb", "outside": "#9aa5b1"}


@dataclass(frozen=True)
class BarRow:
    path: str  # "sandbox" | "outside"
    category: str
    low: float
    high: float


def range_bars(rows: Sequence[BarRow], *, unit: str = "GPU-hours") -> go.Figure:
    """Grouped bars per category, one trace per path, error bar down to the lower bound.

    Long category names are wrapped on the axis only; the data keep the full names.
    """
    fig = go.Figure()
    categories = list(dict.fromkeys(r.category for r in rows))
    for path in ("sandbox", "outside"):
        mine = [r for r in rows if r.path == path]
        if not mine:
            continue
        fig.add_trace(
            go.Bar(
                name=PATH_NAMES[path],
                x=[r.category for r in mine],
                y=[r.high for r in mine],
                marker_color=PATH_COLOURS[path],
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [0.0] * len(mine),
                    "arrayminus": [r.high - r.low for r in mine],
                    "color": "#323f4b",
                },
                customdata=[[r.low] for r in mine],
                hovertemplate="%{x}<br>%{customdata[0]:,.0f}–%{y:,.0f} "
                + unit
                + "<extra>%{fullData.name}</extra>",
            )
        )
    fig.update_layout(
        barmode="group",
        xaxis={
            "categoryorder": "array",
            "categoryarray": categories,
            "tickmode": "array",
            "tickvals": categories,
            "ticktext": [wrap(c) for c in categories],
            "tickangle": 0,
            "automargin": True,
        },
        yaxis={"title": {"text": f"{unit} (bar: upper, whisker: lower)"}, "automargin": True},
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.02, "yanchor": "bottom"},
        margin={"l": 60, "r": 10, "t": 30, "b": 10},
        height=400,
    )
    return fig


def wrap(label: str, width: int = 14) -> str:
    """Break a tick label into short lines (Plotly's ``<br>``)."""
    return "<br>".join(textwrap.wrap(label, width=width)) or label
