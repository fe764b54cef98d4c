"""Pure threshold and burst arithmetic of the detectors (``incidents.windows``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from incidents.windows import MinuteCount, group_bursts, minute_key, over_count, over_share

T = datetime(2026, 10, 14, 19, 0, tzinfo=UTC)


def m(offset: int, hits: int, total: int) -> MinuteCount:
    return MinuteCount(minute=T + timedelta(minutes=offset), hits=hits, total=total)


def test_share_threshold_needs_both_the_share_and_the_floor_of_hits() -> None:
    rows = [m(0, 10, 40), m(1, 9, 40), m(2, 2, 4), m(3, 0, 0)]
    flagged = over_share(rows, share=0.25, min_hits=5)
    # minute 1 is below 25%; minute 2 is 50% but only 2 hits; minute 3 has no creates.
    assert flagged == [m(0, 10, 40)]


def test_count_threshold_flags_minutes_with_enough_hits() -> None:
    assert over_count([m(0, 9, 9), m(1, 10, 10)], min_hits=10) == [m(1, 10, 10)]


def test_consecutive_and_nearby_minutes_form_one_burst_and_a_long_gap_splits() -> None:
    flagged = [m(5, 3, 3), m(0, 1, 1), m(1, 2, 2), m(20, 4, 4)]
    bursts = group_bursts(flagged, merge_gap=timedelta(minutes=5))
    assert [(b.start, b.end) for b in bursts] == [
        (T, T + timedelta(minutes=6)),
        (T + timedelta(minutes=20), T + timedelta(minutes=21)),
    ]
    assert bursts[0].hits == 6 and bursts[0].total == 6
    assert group_bursts([], merge_gap=timedelta(minutes=5)) == []


def test_a_gap_longer_than_the_merge_gap_splits_a_burst() -> None:
    bursts = group_bursts([m(0, 1, 1), m(3, 1, 1)], merge_gap=timedelta(minutes=1))
    assert len(bursts) == 2


def test_window_names_are_the_utc_minute() -> None:
    assert minute_key(T + timedelta(minutes=7)) == "2026-10-14T19:07Z"
