"""Operations charts are pure: given rows, the Plotly dict has the right traces and points."""

from __future__ import annotations

import datetime as dt

from dashboards.figures import operations as figures
from dashboards.figures.layout import EMPTY_NOTE
from dashboards.rows.operations import (
    AddressFailureBucket,
    AddressFailureLoad,
    IncidentClassHours,
    WarmKey,
    address_failure_table,
)

T = dt.datetime(2026, 10, 14, 12, 0, tzinfo=dt.UTC)


def test_address_failures_draw_per_minute_bars_and_a_load_curve_on_their_own_axes() -> None:
    per_minute = [
        AddressFailureBucket(T, 60, 3, 6),
        AddressFailureBucket(T + dt.timedelta(minutes=1), 60, 1, 0),
    ]
    by_load = [AddressFailureLoad(1, 4, 2), AddressFailureLoad(3, 6, 9)]
    fig = figures.address_failures_figure(per_minute, by_load)
    bars, curve = fig["data"]
    assert bars["type"] == "bar" and list(bars["y"]) == [6.0, 0.0]
    assert list(bars["x"]) == ["2026-10-14 12:00:00", "2026-10-14 12:01:00"]
    assert (curve["xaxis"], curve["yaxis"]) == ("x2", "y2")
    assert list(curve["x"]) == [1, 3] and list(curve["y"]) == [0.5, 1.5]
    assert "annotations" not in fig["layout"]


def test_sandboxes_without_address_events_are_shown_as_unknown() -> None:
    per_minute = [AddressFailureBucket(T, 60, 3, 2, unknown=2)]
    fig = figures.address_failures_figure(per_minute, [AddressFailureLoad(2, 3, 2, unknown=2)])
    bars, curve = fig["data"]
    assert list(bars["text"]) == ["2 unknown"] and list(curve["text"]) == ["n=3, 2 unknown"]
    assert list(curve["y"]) == [2.0]  # 2 failures over the 1 sandbox we know about
    (note,) = fig["layout"]["annotations"]
    assert note["text"] == "2 sandboxes unknown (no address Event)"
    (row, _) = address_failure_table(per_minute, [AddressFailureLoad(2, 3, 2, unknown=2)])
    assert row.unknown == 2


def test_failures_per_minute_are_scaled_from_wider_buckets() -> None:
    fig = figures.address_failures_figure([AddressFailureBucket(T, 300, 2, 10)], [])
    assert list(fig["data"][0]["y"]) == [2.0]


def test_empty_address_failures_keep_both_traces_and_say_so() -> None:
    fig = figures.address_failures_figure([], [])
    assert [len(t["x"]) for t in fig["data"]] == [0, 0]
    assert fig["layout"]["annotations"][0]["text"] == EMPTY_NOTE


def test_address_failure_table_holds_both_views_in_one_long_table() -> None:
    rows = address_failure_table([AddressFailureBucket(T, 60, 3, 6)], [AddressFailureLoad(2, 4, 2)])
    assert [(r.view, r.bucket_start, r.node_load, r.rate) for r in rows] == [
        ("per_minute", T, None, 6.0),
        ("by_node_load", None, 2, 0.5),
    ]


def test_warm_use_draws_idle_hours_as_bars_and_the_hit_rate_as_percent() -> None:
    rows = [
        WarmKey(1, "a", "abcdef0123456789", 2, 4, 3, 0.91667),
        WarmKey(3, "c", "ffff000011112222", 0, 0, 1, 0.08333),
    ]
    fig = figures.warm_use_figure(rows)
    idle, rate = fig["data"]
    assert list(idle["x"]) == ["a (#1) · abcdef01", "c (#3) · ffff0000"]
    assert list(idle["y"]) == [0.9167, 0.0833]
    assert list(rate["y"]) == [50.0, None]  # no acquisitions: no rate, not 0 %
    assert rate["yaxis"] == "y2" and fig["layout"]["yaxis2"]["range"] == [0, 105]


def test_incident_hours_draw_one_bar_trace_per_path_with_the_lower_bound_as_whisker() -> None:
    rows = [
        IncidentClassHours("sandbox", "implementation", "sandbox implementation", 2, 974.0, 1469.0),
        IncidentClassHours("outside", "not_established", "not established", 1, 2351.0, 2351.0),
    ]
    fig = figures.incident_hours_figure(rows)
    sandbox, outside = fig["data"]
    assert list(sandbox["x"]) == ["sandbox implementation"]
    assert list(sandbox["y"]) == [1469.0]
    assert list(sandbox["error_y"]["arrayminus"]) == [495.0]
    assert list(outside["text"]) == ["1 case"]
    assert fig["layout"]["barmode"] == "group"


def test_empty_incident_hours_keep_both_traces() -> None:
    fig = figures.incident_hours_figure([])
    assert [len(t["x"]) for t in fig["data"]] == [0, 0]
    assert fig["layout"]["annotations"]
