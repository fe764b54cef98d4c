"""Shared pieces of the live charts: the house layout, time and value axes, the figure dict.

Pure (no Django). Invariants every live chart relies on (the page script and its tests too):
* Time axes are UTC, written ``YYYY-MM-DD HH:MM:SS`` (Plotly reads them as dates).
* ``layout.uirevision`` is constant, so a live update keeps the operator's zoom.
* An empty chart keeps its traces (the page addresses them by position) and shows
  :data:`EMPTY_NOTE` instead of Plotly's placeholder ticks.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import plotly.graph_objects as go

from dashboards.window import Window

Figure = dict[str, Any]

PERCENTILE_COLOURS = {"p50": "#2186eb", "p90": "#f0b429", "p99": "#e12d39"}
EMPTY_NOTE = "No data in this window"


def utc_label(value: dt.datetime) -> str:
    """A time-axis label: UTC, ``YYYY-MM-DD HH:MM:SS`` (Plotly reads it as a date)."""
    return value.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def ms_to_s(ms: float | None) -> float | None:
    """Durations are drawn in seconds (tables and CSV keep milliseconds)."""
    return None if ms is None else ms / 1000.0


def chart_layout(*, empty: bool, **extra: Any) -> dict[str, Any]:
    """The house layout plus ``extra``; an ``empty`` chart hides placeholder ticks and says so."""
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


def time_axis(window: Window | None) -> dict[str, Any]:
    """A UTC date axis spanning ``window`` (the whole window, even where no point falls)."""
    axis: dict[str, Any] = {"type": "date", "title": {"text": "time (UTC)"}, "gridcolor": "#e4e7eb"}
    if window is not None:
        axis["range"] = [utc_label(window.since), utc_label(window.until)]
    return axis


def value_axis(title: str, **extra: Any) -> dict[str, Any]:
    """A value axis from zero."""
    return {"title": {"text": title}, "rangemode": "tozero", "gridcolor": "#e4e7eb", **extra}


def to_figure(data: list[Any], layout: dict[str, Any]) -> Figure:
    """Validated by ``plotly.graph_objects`` (a misspelt property fails here), then a dict.

    A trace given as a plain dict (``{"type": "bar", ...}``) is validated on its first two
    points and passed on as given: Plotly validates and copies every element of every array,
    which for the per-step chart's 8 × 240 bars cost more than its queries. Use it where a
    trace's arrays are long and hold only plain numbers, strings and lists of them.
    """
    checked = go.Figure(
        data=[_head(t) if isinstance(t, dict) else t for t in data], layout=layout
    ).to_plotly_json()
    checked["data"] = [
        t if isinstance(t, dict) else done for t, done in zip(data, checked["data"], strict=True)
    ]
    return checked


def _head(trace: dict[str, Any]) -> dict[str, Any]:
    """``trace`` with every array (at any depth of nested dicts) cut to its first two items."""
    return {
        k: v[:2] if isinstance(v, list) else _head(v) if isinstance(v, dict) else v
        for k, v in trace.items()
    }
