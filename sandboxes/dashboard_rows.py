"""Row shapes of the dashboards: what ``dashboard_selectors`` returns and ``figures`` draws.

Pure (no Django): frozen dataclasses, each with the columns it shows in its data table and
CSV download (``TABLE``). Times are tz-aware UTC datetimes; durations are milliseconds.
A percentile is ``None`` when its bucket holds no value (never a made-up 0).
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

# Bucket widths (seconds) the time-series charts may use: about 60 points per window.
BUCKET_LADDER_S = (10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800)
MAX_POINTS = 60


@dataclass(frozen=True)
class Window:
    """The time range a dashboard shows, ``[since, until)``, cut into ``bucket_s`` buckets."""

    since: dt.datetime
    until: dt.datetime
    bucket_s: int

    @property
    def minutes(self) -> int:
        return round((self.until - self.since).total_seconds() / 60)


def window_ending(*, now: dt.datetime, minutes: int) -> Window:
    """The last ``minutes`` before ``now``, with the smallest ladder bucket giving ≤60 points."""
    if minutes < 1:
        raise ValueError("a window is at least one minute")
    span_s = minutes * 60
    bucket_s = next((b for b in BUCKET_LADDER_S if span_s / b <= MAX_POINTS), BUCKET_LADDER_S[-1])
    return Window(since=now - dt.timedelta(minutes=minutes), until=now, bucket_s=bucket_s)


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


@dataclass(frozen=True)
class StateCount:
    state: str
    count: int
    TABLE: ClassVar[tuple[str, ...]] = ("state", "count")


@dataclass(frozen=True)
class CreateRate:
    """Creates requested in one bucket: the mean rate and the busiest single second."""

    bucket_start: dt.datetime
    bucket_s: int
    creates: int
    peak_per_s: int
    TABLE: ClassVar[tuple[str, ...]] = (
        "bucket_start",
        "bucket_s",
        "creates",
        "mean_per_s",
        "peak_per_s",
    )

    @property
    def mean_per_s(self) -> float:
        return self.creates / self.bucket_s


@dataclass(frozen=True)
class LatencyBucket:
    """Create-to-Ready (requested → Ready) percentiles of the sandboxes Ready in one bucket."""

    bucket_start: dt.datetime
    n: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    TABLE: ClassVar[tuple[str, ...]] = ("bucket_start", "n", "p50_ms", "p90_ms", "p99_ms")


@dataclass(frozen=True)
class WaitBucket:
    """Acquisition waits (queue included) of the acquisitions finished in one bucket."""

    bucket_start: dt.datetime
    n: int
    wait_p50_ms: float | None
    wait_p99_ms: float | None
    queue_p50_ms: float | None
    queue_p99_ms: float | None
    TABLE: ClassVar[tuple[str, ...]] = (
        "bucket_start",
        "n",
        "wait_p50_ms",
        "wait_p99_ms",
        "queue_p50_ms",
        "queue_p99_ms",
    )


@dataclass(frozen=True)
class HistogramBin:
    """Sandboxes whose create-to-Ready fell in ``[start_ms, start_ms + width_ms)``."""

    start_ms: float
    width_ms: float
    present: int
    pulled: int
    unknown: int
    TABLE: ClassVar[tuple[str, ...]] = ("start_ms", "width_ms", "present", "pulled", "unknown")


@dataclass(frozen=True)
class ImageSplit:
    """Create-to-Ready by whether the image was already on the node."""

    image: str  # "present" | "pulled" | "unknown"
    n: int
    p50_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    TABLE: ClassVar[tuple[str, ...]] = ("image", "n", "p50_ms", "p90_ms", "p99_ms")


@dataclass(frozen=True)
class WarmHits:
    """Successful acquisitions of one job by where the sandbox came from.

    A hit is a sandbox handed out without a create on the caller's path: ``warm`` (a
    never-used prewarmed pod) or ``reused`` (a checked-reuse grading pod).
    """

    job_id: int
    job_name: str
    warm: int
    reused: int
    created: int
    TABLE: ClassVar[tuple[str, ...]] = (
        "job_id",
        "job_name",
        "warm",
        "reused",
        "created",
        "total",
        "hit_rate",
    )

    @property
    def total(self) -> int:
        return self.warm + self.reused + self.created

    @property
    def hit_rate(self) -> float | None:
        return (self.warm + self.reused) / self.total if self.total else None


def _cell(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, float):
        return round(value, 3)
    return value


def table(rows: Iterable[Any], columns: Sequence[str]) -> list[list[Any]]:
    """Rows as lists of JSON/CSV-ready cells in ``columns`` order (datetimes ISO 8601 UTC)."""
    return [[_cell(getattr(row, name)) for name in columns] for row in rows]
