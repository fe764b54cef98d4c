"""Charts of the grading page as pure functions: rows in, Plotly figure dicts out.

Same invariants as ``figures.overview`` (both use ``figures.layout``): every trace is
always present, empty when there is no data; time axes are UTC; ``uirevision`` is constant
so a live update keeps the operator's zoom. No Django here.
"""

from __future__ import annotations

from collections.abc import Sequence

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
from dashboards.rows.grading import JobCreates, SourceLatency, VerdictBucket
from dashboards.window import Window

# The verdicts' colours (grading.states' palette: resolved green, a valid 0 grey).
VERDICT_COLOURS = {"resolved": "#3ebd93", "unresolved": "#9aa5b1", "no_verdict": "#e12d39"}
RATE_COLOURS = {"no_verdict": "#e12d39", "probe refusal": "#f0b429"}


def verdicts_figure(rows: Sequence[VerdictBucket], *, window: Window | None = None) -> Figure:
    """Gradings per minute by verdict, stacked per bucket."""
    x = [utc_label(r.bucket_start) for r in rows]
    traces = [
        go.Bar(
            name=verdict.replace("_", " "),
            x=x,
            y=[r.per_minute(getattr(r, verdict)) for r in rows],
            marker={"color": colour},
        )
        for verdict, colour in VERDICT_COLOURS.items()
    ]
    layout = chart_layout(
        empty=not rows,
        xaxis=time_axis(window),
        yaxis=value_axis("gradings per minute"),
        barmode="stack",
        bargap=0.05,
    )
    return to_figure(traces, layout)


def rates_figure(rows: Sequence[VerdictBucket], *, window: Window | None = None) -> Figure:
    """The no_verdict rate and the probe-refusal rate per bucket (share of gradings)."""
    x = [utc_label(r.bucket_start) for r in rows]
    series = {
        "no_verdict": [r.no_verdict_rate for r in rows],
        "probe refusal": [r.probe_refusal_rate for r in rows],
    }
    traces = [
        go.Scatter(
            name=name,
            x=x,
            y=values,
            mode="lines+markers",
            connectgaps=False,
            line={"color": RATE_COLOURS[name], "width": 2},
        )
        for name, values in series.items()
    ]
    layout = chart_layout(
        empty=not rows,
        xaxis=time_axis(window),
        yaxis=value_axis("share of gradings", tickformat=".0%"),
    )
    return to_figure(traces, layout)


def acquisition_figure(rows: Sequence[SourceLatency]) -> Figure:
    """Grading acquisition p50 and p99 per source (fresh, warm, reused)."""
    x = [r.source for r in rows]
    traces = [
        go.Bar(
            name=name,
            x=x,
            y=[ms_to_s(getattr(r, f"{name}_ms")) for r in rows],
            marker={"color": PERCENTILE_COLOURS[name]},
        )
        for name in ("p50", "p99")
    ]
    layout = chart_layout(
        empty=not any(r.n for r in rows),
        xaxis={"title": {"text": "source"}},
        yaxis=value_axis("seconds"),
        barmode="group",
    )
    return to_figure(traces, layout)


def creates_figure(rows: Sequence[JobCreates]) -> Figure:
    """Grading sandboxes created per grading, per job."""
    traces = [
        go.Bar(
            name="creates per grading",
            x=[f"{r.job_name or 'job'} #{r.job_id}" for r in rows],
            y=[r.creates_per_grading for r in rows],
            marker={"color": "#7b61ff"},
        )
    ]
    layout = chart_layout(
        empty=not rows,
        xaxis={"title": {"text": "job"}, "type": "category"},
        yaxis=value_axis("creates per grading"),
    )
    return to_figure(traces, layout)
