"""Row shapes of the grading page (``/gradings/``): what ``selectors.grading`` returns and
``figures.grading`` draws.

Pure (no Django): frozen dataclasses, each with the columns of its data table and CSV
(``TABLE``). Times are tz-aware UTC; durations are milliseconds.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import ClassVar


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


@dataclass(frozen=True)
class VerdictBucket:
    """Gradings that reached their verdict in one bucket (of ``finished_at``), by verdict."""

    bucket_start: dt.datetime
    bucket_s: int
    resolved: int
    unresolved: int
    no_verdict: int
    probe_refused: int  # gradings with at least one sandbox refused by the probe
    TABLE: ClassVar[tuple[str, ...]] = (
        "bucket_start",
        "bucket_s",
        "resolved",
        "unresolved",
        "no_verdict",
        "probe_refused",
        "no_verdict_rate",
        "probe_refusal_rate",
    )

    @property
    def done(self) -> int:
        return self.resolved + self.unresolved + self.no_verdict

    @property
    def no_verdict_rate(self) -> float | None:
        return _rate(self.no_verdict, self.done)

    @property
    def probe_refusal_rate(self) -> float | None:
        return _rate(self.probe_refused, self.done)

    def per_minute(self, count: int) -> float:
        return count * 60.0 / self.bucket_s


@dataclass(frozen=True)
class SourceLatency:
    """Grading-sandbox acquisitions of one source (fresh, warm, reused) in the window."""

    source: str
    n: int
    p50_ms: float | None
    p99_ms: float | None
    TABLE: ClassVar[tuple[str, ...]] = ("source", "n", "p50_ms", "p99_ms")


@dataclass(frozen=True)
class JobCreates:
    """Per job: grading sandboxes created and gradings decided in the window."""

    job_id: int | None
    job_name: str
    creates: int
    gradings: int
    TABLE: ClassVar[tuple[str, ...]] = (
        "job_id",
        "job_name",
        "creates",
        "gradings",
        "creates_per_grading",
    )

    @property
    def creates_per_grading(self) -> float | None:
        return self.creates / self.gradings if self.gradings else None
