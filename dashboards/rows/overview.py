"""Row shapes of the overview page (``/``): what ``selectors.overview`` returns and
``figures.overview`` draws.

Pure (no Django): frozen dataclasses, each with the columns it shows in its data table and
CSV download (``TABLE``; ``dashboards.export`` turns them into cells). Times are tz-aware
UTC datetimes; durations are milliseconds. A percentile is ``None`` when its bucket holds
no value (never a made-up 0).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import ClassVar


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

    job_id: int | None  # None: the "others" row (the jobs beyond the top N)
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
