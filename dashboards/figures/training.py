"""Charts of the training page as pure functions: rows in, Plotly figure dicts out.

Same invariants as ``figures.operations`` (both use ``figures.layout``): every trace is
always present, empty when there is no data (one trace per critical-path category, in
:data:`sandboxes.critical_path.CATEGORIES` order, so the page can address them by
position); the charts over time draw one line per shown job (none: one empty line); time
axes are UTC; ``uirevision`` is constant. No Django here.
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
from dashboards.rows.training import (
    EstimateBucket,
    JobEstimate,
    JobPathShares,
    StepShares,
    WaitingShareBucket,
)
from dashboards.window import Window
from sandboxes.critical_path import CATEGORIES

# Figure 5's palette: sandbox categories warm, the learner and generation cool, rest grey.
CATEGORY_COLOURS = {
    "rollout_acquisition": "#f0b429",
    "grading_acquisition": "#e12d39",
    "tests": "#9446ed",
    "failure_retry": "#7a0ecc",
    "generation": "#2186eb",
    "commands": "#47a3f3",
    "capture": "#7cc4fa",
    "release": "#bae3ff",
    "other": "#9aa5b1",
    "learner": "#3ebd93",
    "unresolved": "#e4e7eb",
}


def _job_label(job_id: int, name: str) -> str:
    return f"{name} (#{job_id})"


def critical_path_figure(rows: Sequence[JobPathShares]) -> Figure:
    """Figure 5: one stacked horizontal bar per job, each category's share of step time."""
    labels = [_job_label(r.job_id, r.job_name) for r in rows]
    data = [
        go.Bar(
            name=category.replace("_", " "),
            orientation="h",
            y=labels,
            x=[round(r.shares.get(category, 0.0) * 100, 3) for r in rows],
            marker={"color": CATEGORY_COLOURS[category]},
            hovertemplate="%{y}: %{x:.1f}%<extra>" + category + "</extra>",
        )
        for category in CATEGORIES
    ]
    layout = chart_layout(
        empty=not rows,
        barmode="stack",
        hovermode="closest",
        height=max(300, 80 + 36 * len(rows)),
        margin={"l": 180, "r": 16, "t": 48, "b": 48},
        xaxis=value_axis("share of learner-step time on the critical path (%)", range=[0, 100]),
        yaxis={"type": "category", "automargin": True, "autorange": "reversed"},
    )
    return to_figure(data, layout)


STEP_BARS = 240  # at most this many bars in the per-step chart (the table keeps every step)


def merged_steps(rows: Sequence[StepShares], *, limit: int = STEP_BARS) -> list[StepShares]:
    """``rows`` as at most ``limit`` bars: each job's steps (by end time) get an equal part
    of ``limit``, and over it runs of ``ceil(n / part)`` consecutive steps of the job are
    merged into one bar, placed at the run's last end, its step the run's last, its shares
    the interval-weighted mean of the run's (summed seconds over summed intervals, as
    ``critical_path.combine`` sums steps). Fewer rows pass as they are."""
    if len(rows) <= limit:
        return list(rows)
    jobs: dict[int, list[StepShares]] = {}
    for row in rows:
        jobs.setdefault(row.job_id, []).append(row)
    part = max(1, limit // len(jobs))
    out: list[StepShares] = []
    for steps in jobs.values():
        size = -(-len(steps) // part)
        out.extend(_merged(steps[i : i + size]) for i in range(0, len(steps), size))
    return sorted(out, key=lambda r: (r.ended_at, r.job_id, r.step))


def _merged(run: Sequence[StepShares]) -> StepShares:
    if len(run) == 1:
        return run[0]
    total = sum(r.interval_s for r in run)
    shares = {
        c: (sum(r.shares.get(c, 0.0) * r.interval_s for r in run) / total if total else 0.0)
        for c in CATEGORIES
    }
    last = run[-1]
    return StepShares(
        job_id=last.job_id,
        step=last.step,
        ended_at=last.ended_at,
        interval_s=total,
        shares=shares,
    )


def step_shares_figure(rows: Sequence[StepShares], *, window: Window | None = None) -> Figure:
    """Per-step shares over time: one stacked bar per step at the time its training ended;
    over :data:`STEP_BARS` steps, runs of consecutive steps share a bar (:func:`merged_steps`)
    so the figure stays bounded (Plotly's cost grows with the bars)."""
    rows = merged_steps(rows)
    x = [utc_label(r.ended_at) for r in rows]
    customdata = [[r.job_id, r.step] for r in rows]
    data = [  # plain dicts: validated on their first points (layout.to_figure)
        {
            "type": "bar",
            "name": category.replace("_", " "),
            "x": x,
            "y": [round(r.shares.get(category, 0.0) * 100, 3) for r in rows],
            "marker": {"color": CATEGORY_COLOURS[category]},
            "customdata": customdata,
            "hovertemplate": "job %{customdata[0]} step %{customdata[1]}: %{y:.1f}%<extra>"
            + category
            + "</extra>",
        }
        for category in CATEGORIES
    ]
    layout = chart_layout(
        empty=not rows,
        barmode="stack",
        hovermode="closest",
        xaxis=time_axis(window),
        yaxis=value_axis("share of the step (%)", range=[0, 100]),
    )
    return to_figure(data, layout)


def estimate_figure(rows: Sequence[JobEstimate]) -> Figure:
    """Measured mean step interval beside Little's-law estimate per job, and the shares."""
    labels = [_job_label(r.job_id, r.job_name) for r in rows]
    data = [
        go.Bar(
            name="measured step interval (s)", x=labels, y=[r.measured_interval_s for r in rows]
        ),
        go.Bar(
            name="Little's law estimate (s), not a measurement",
            x=labels,
            y=[r.estimated_interval_s for r in rows],
            marker={"pattern": {"shape": "/"}},
        ),
        go.Scatter(
            name="waiting share (%)",
            x=labels,
            y=[None if r.waiting_share is None else r.waiting_share * 100 for r in rows],
            mode="markers",
            yaxis="y2",
        ),
        go.Scatter(
            name="f: estimated step reduction (%)",
            x=labels,
            y=[None if r.f is None else r.f * 100 for r in rows],
            mode="markers",
            marker={"symbol": "diamond"},
            yaxis="y2",
        ),
    ]
    layout = chart_layout(
        empty=not rows,
        barmode="group",
        hovermode="closest",
        margin={"l": 56, "r": 56, "t": 48, "b": 48},
        xaxis={"type": "category", "automargin": True},
        yaxis=value_axis("mean step interval (s)"),
        yaxis2={
            "title": {"text": "%"},
            "overlaying": "y",
            "side": "right",
            "rangemode": "tozero",
            "showgrid": False,
        },
    )
    return to_figure(data, layout)


def _by_job(rows: Sequence[WaitingShareBucket] | Sequence[EstimateBucket]) -> dict[str, list]:
    lines: dict[str, list] = {}
    for row in rows:
        lines.setdefault(_job_label(row.job_id, row.job_name), []).append(row)
    return lines


def waiting_share_figure(rows: Sequence[WaitingShareBucket], *, window: Window | None) -> Figure:
    """Waiting share over time: one line per shown job, by bucket of trajectory end."""
    data = [
        go.Scatter(
            name=label,
            mode="lines+markers",
            x=[utc_label(r.bucket_start) for r in mine],
            y=[None if r.waiting_share is None else round(r.waiting_share * 100, 3) for r in mine],
            hovertemplate="%{y:.1f}%<extra>" + label + "</extra>",
        )
        for label, mine in _by_job(rows).items()
    ] or [go.Scatter(name="waiting share", x=[], y=[], mode="lines")]
    layout = chart_layout(
        empty=not rows,
        hovermode="closest",
        xaxis=time_axis(window),
        yaxis=value_axis("acquisition over trajectory time (%)"),
    )
    return to_figure(data, layout)


def estimate_time_figure(rows: Sequence[EstimateBucket], *, window: Window | None) -> Figure:
    """Measured mean step interval (solid) and Little's-law estimate (dashed) per job."""
    data = []
    for label, mine in _by_job(rows).items():
        x = [utc_label(r.bucket_start) for r in mine]
        data.append(
            go.Scatter(
                name=f"{label} measured",
                legendgroup=label,
                mode="lines+markers",
                x=x,
                y=[r.measured_interval_s for r in mine],
            )
        )
        data.append(
            go.Scatter(
                name=f"{label} Little's law (estimate)",
                legendgroup=label,
                mode="lines",
                line={"dash": "dash"},
                x=x,
                y=[r.estimated_interval_s for r in mine],
            )
        )
    if not data:
        data = [go.Scatter(name="measured", x=[], y=[], mode="lines")]
    layout = chart_layout(
        empty=not rows,
        hovermode="closest",
        xaxis=time_axis(window),
        yaxis=value_axis("step interval (s)"),
    )
    return to_figure(data, layout)
