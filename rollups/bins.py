"""Histogram bins of the rollups: log-spaced, with a stated relative error (DDSketch's bins).

Pure (no Django). A value ``v`` (milliseconds) of at least :data:`MIN_MS` falls in bin
``ceil(ln(v) / ln(GAMMA))``; the bin's representative value is within :data:`ALPHA` of every
value in it (relative error). Values below :data:`MIN_MS` (and negative clock errors) fall in
:data:`ZERO_BIN`, represented by 0. A percentile read from these bins, interpolated between
the two order statistics around its rank exactly as ``percentile_cont`` does, is therefore
within ``ALPHA`` (relative) or ``MIN_MS`` (absolute) of the exact ``percentile_cont``: each of
the two order statistics is, and the interpolation is a convex combination.

:func:`bin_sql` is the same rule in PostgreSQL, used by the refresh AND by the raw part of
a rollup read, so both sides bin identically.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

ALPHA = 0.05
GAMMA = (1 + ALPHA) / (1 - ALPHA)
MIN_MS = 1.0
ZERO_BIN = -1000
_LN_GAMMA = math.log(GAMMA)


def bin_sql(value: str) -> str:
    """SQL (PostgreSQL) for the bin of the DOUBLE PRECISION expression ``value``."""
    return (
        f"(CASE WHEN ({value}) < {MIN_MS!r} THEN {ZERO_BIN} "
        f"ELSE CAST(CEIL(LN({value}) / {_LN_GAMMA!r}) AS INTEGER) END)"
    )


def representative(index: int) -> float:
    """The value a bin stands for: within ``ALPHA`` of every value in it."""
    if index == ZERO_BIN:
        return 0.0
    return 2.0 * GAMMA**index / (GAMMA + 1.0)


def percentiles(
    counts: Iterable[tuple[int, int]], fractions: Sequence[float]
) -> tuple[int, tuple[float | None, ...]]:
    """``(n, values)`` from ``(bin, count)`` pairs: ``percentile_cont`` over the representatives."""
    ordered = sorted((b, c) for b, c in counts if c > 0)
    n = sum(c for _, c in ordered)
    if n == 0:
        return 0, tuple(None for _ in fractions)
    out = []
    for fraction in fractions:
        position = (n - 1) * fraction
        low_rank = math.floor(position)
        lo = _value_at(ordered, low_rank)
        hi = _value_at(ordered, min(low_rank + 1, n - 1))
        out.append(lo + (hi - lo) * (position - low_rank))
    return n, tuple(out)


def _value_at(ordered: Sequence[tuple[int, int]], rank: int) -> float:
    seen = 0
    for index, count in ordered:
        seen += count
        if rank < seen:
            return representative(index)
    return representative(ordered[-1][0])
