"""Figures are pure: given rows, the Plotly dict has the right traces, points and colours."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

from dashboards.figures import overview as figures
from dashboards.figures.layout import EMPTY_NOTE
from dashboards.rows.overview import (
    CreateRate,
    HistogramBin,
    ImageSplit,
    LatencyBucket,
    StateCount,
    WaitBucket,
    WarmHits,
)
from dashboards.window import window_ending

T = dt.datetime(2026, 10, 14, 12, 0, tzinfo=dt.UTC)
# Every module of the package that must import without Django: rows, figures, their helpers.
PURE_MODULES = (
    "dashboards.figures.overview",
    "dashboards.figures.operations",
    "dashboards.figures.incidents",
    "dashboards.figures.layout",
    "dashboards.rows.overview",
    "dashboards.rows.operations",
    "dashboards.rows.incidents",
    "dashboards.window",
    "dashboards.stats",
)


def _trace(fig: dict, name: str) -> dict:
    matches = [t for t in fig["data"] if t.get("name") == name]
    assert len(matches) == 1, [t.get("name") for t in fig["data"]]
    return matches[0]


def test_states_bar_has_one_bar_per_state_in_the_state_colour() -> None:
    rows = [StateCount("requested", 2), StateCount("ready", 5), StateCount("failed", 1)]
    fig = figures.states_figure(rows, colours={"ready": "#00ff00", "failed": "#ff0000"})
    (bar,) = fig["data"]
    assert bar["type"] == "bar"
    assert list(bar["x"]) == ["requested", "ready", "failed"]
    assert list(bar["y"]) == [2, 5, 1]
    assert list(bar["marker"]["color"]) == ["#9aa5b1", "#00ff00", "#ff0000"]
    assert "annotations" not in fig["layout"]


def test_an_empty_chart_keeps_its_traces_and_says_there_is_no_data() -> None:
    fig = figures.ready_time_figure([])
    assert [t["name"] for t in fig["data"]] == ["p50", "p90", "p99"]
    assert all(len(t["x"]) == 0 for t in fig["data"])
    assert fig["layout"]["annotations"][0]["text"] == EMPTY_NOTE


def test_create_to_ready_lines_are_in_seconds_with_utc_times() -> None:
    rows = [
        LatencyBucket(T, 3, 1500.0, 2500.0, 4000.0),
        LatencyBucket(T + dt.timedelta(minutes=1), 1, 800.0, 800.0, 800.0),
    ]
    window = window_ending(now=T + dt.timedelta(hours=1), minutes=60)
    fig = figures.ready_time_figure(rows, window=window)
    p99 = _trace(fig, "p99")
    assert list(p99["x"]) == ["2026-10-14 12:00:00", "2026-10-14 12:01:00"]
    assert list(p99["y"]) == [4.0, 0.8]
    assert list(_trace(fig, "p50")["y"]) == [1.5, 0.8]
    assert fig["layout"]["xaxis"]["range"] == ["2026-10-14 12:00:00", "2026-10-14 13:00:00"]
    assert fig["layout"]["uirevision"] == "keep"


def test_creates_chart_shows_the_mean_rate_and_marks_the_burst_peak() -> None:
    rows = [
        CreateRate(T, 60, creates=120, peak_per_s=2),
        CreateRate(T + dt.timedelta(minutes=1), 60, creates=300, peak_per_s=132),
        CreateRate(T + dt.timedelta(minutes=2), 60, creates=60, peak_per_s=1),
    ]
    fig = figures.creates_figure(rows)
    assert list(_trace(fig, "mean creates/s")["y"]) == [2.0, 5.0, 1.0]
    assert list(_trace(fig, "peak second (burst)")["y"]) == [2, 132, 1]
    (note,) = fig["layout"]["annotations"]
    assert note["text"] == "peak 132/s"
    assert note["x"] == "2026-10-14 12:01:00"


def test_wait_chart_draws_wait_and_queue_and_leaves_missing_percentiles_as_gaps() -> None:
    rows = [
        WaitBucket(T, 4, 250.0, 397.0, 20.0, 39.6),
        WaitBucket(T + dt.timedelta(minutes=1), 1, 600.0, 600.0, None, None),
    ]
    fig = figures.wait_figure(rows)
    assert [t["name"] for t in fig["data"]] == ["wait p50", "wait p99", "queue p50", "queue p99"]
    assert list(_trace(fig, "wait p99")["y"]) == [0.397, 0.6]
    assert list(_trace(fig, "queue p50")["y"]) == [0.02, None]
    assert _trace(fig, "queue p50")["line"]["dash"] == "dot"


def test_histogram_stacks_present_pulled_and_unknown_at_bin_centres() -> None:
    bins = [HistogramBin(0.0, 2000.0, 3, 1, 0), HistogramBin(4000.0, 2000.0, 0, 2, 1)]
    fig = figures.ready_histogram_figure(bins)
    assert fig["layout"]["barmode"] == "stack"
    present, pulled, unknown = fig["data"]
    assert list(present["x"]) == [1.0, 5.0]
    assert present["width"] == 2.0
    assert (list(present["y"]), list(pulled["y"]), list(unknown["y"])) == ([3, 0], [1, 2], [0, 1])


def test_pulled_vs_present_names_each_group_with_its_count() -> None:
    fig = figures.ready_split_figure([ImageSplit("pulled", 7, 17400.0, 74300.0, 90000.0)])
    names = [t["name"] for t in fig["data"]]
    assert names == ["present", "pulled (n=7)", "unknown"]
    assert list(_trace(fig, "pulled (n=7)")["y"]) == [17.4, 74.3, 90.0]
    assert len(_trace(fig, "present")["x"]) == 0


def test_warm_hit_chart_stacks_sources_and_plots_the_rate_in_percent() -> None:
    rows = [WarmHits(1, "alpha", 3, 1, 1), WarmHits(2, "beta", 0, 0, 0)]
    fig = figures.warm_hits_figure(rows)
    rate = _trace(fig, "warm-hit rate")
    assert list(rate["x"]) == ["alpha (#1)", "beta (#2)"]
    assert list(rate["y"]) == [80.0, None]
    assert rate["yaxis"] == "y2"
    assert list(_trace(fig, "warm")["y"]) == [3, 0]


def test_every_figure_is_plain_json() -> None:
    fig = figures.creates_figure([CreateRate(T, 15, 3, 2)])
    assert json.loads(json.dumps(fig)) == fig


def test_figures_and_their_rows_import_no_django() -> None:
    """Pure modules: a chart can be drawn (or tested) without configuring Django."""
    code = (
        f"import sys, {', '.join(PURE_MODULES)}; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=Path(__file__).resolve().parents[3],
    )
    assert out.stdout.strip() == "[]"
