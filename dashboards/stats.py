"""Pure arithmetic of the dashboards: histogram bin widths and percentile interpolation.

No Django. :func:`percentile_from_ranks` must interpolate exactly as PostgreSQL's
``percentile_cont`` does (``dashboards.sql`` relies on it for the portable method, and the
tests compare both methods on PostgreSQL).
"""

from __future__ import annotations

import math


def nice_step(raw: float) -> float:
    """The smallest 1-2-5 × 10^k step that is at least ``raw`` (histogram bin widths)."""
    if raw <= 0 or not math.isfinite(raw):
        return 1.0
    exponent = math.floor(math.log10(raw))
    for mantissa in (1, 2, 5, 10):
        step = mantissa * 10.0**exponent
        if step >= raw * (1 - 1e-12):
            return step
    return 10.0 ** (exponent + 1)


def percentile_from_ranks(
    lo: float | None, hi: float | None, n: int, fraction: float
) -> float | None:
    """``percentile_cont`` from the two values around rank ``(n-1)·fraction`` (0-based)."""
    if lo is None or n <= 0:
        return None
    position = (n - 1) * fraction
    weight = position - math.floor(position)
    upper = lo if hi is None else hi
    return lo + (upper - lo) * weight
