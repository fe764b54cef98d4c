"""The dashboards' pure arithmetic: percentile interpolation and histogram bin steps."""

from __future__ import annotations

from dashboards.stats import nice_step, percentile_from_ranks


def test_percentile_from_neighbouring_ranks_interpolates_like_percentile_cont() -> None:
    assert percentile_from_ranks(50.0, 51.0, 100, 0.5) == 50.5
    assert percentile_from_ranks(7.0, None, 1, 0.99) == 7.0
    assert percentile_from_ranks(None, None, 0, 0.5) is None


def test_histogram_steps_are_one_two_five() -> None:
    assert [nice_step(x) for x in (0.7, 1.0, 1.2, 3.0, 7.0, 2400.0)] == [
        1.0,
        1.0,
        2.0,
        5.0,
        10.0,
        5000.0,
    ]
