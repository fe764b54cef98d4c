"""Row shapes of the training page (``/training/``): what ``selectors.training`` returns and
``figures.training`` draws (Appendix J, Figure 5).

Pure (no Django), like ``rows.operations``: frozen dataclasses, each with the columns of its
data table and CSV (``TABLE``). Shares are fractions of summed step time; the Little's-law
interval is a model output and its row says so (``caveat``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import ClassVar

from sandboxes.critical_path import CATEGORIES


@dataclass(frozen=True)
class JobPathShares:
    """Critical-path shares of one job's steps in the window (a bar of Figure 5)."""

    job_id: int
    job_name: str
    steps: int
    shares: dict[str, float]
    TABLE: ClassVar[tuple[str, ...]] = ("job_id", "job_name", "steps", *CATEGORIES)

    def __getattr__(self, name: str) -> float:
        # The table's category columns read the shares (``dashboards.export.cells``).
        if name in CATEGORIES:
            return self.shares.get(name, 0.0)
        raise AttributeError(name)


@dataclass(frozen=True)
class StepShares:
    """One learner step's shares, placed at the time its training ended."""

    job_id: int
    step: int
    ended_at: dt.datetime
    interval_s: float
    shares: dict[str, float]
    TABLE: ClassVar[tuple[str, ...]] = ("job_id", "step", "ended_at", "interval_s", *CATEGORIES)

    def __getattr__(self, name: str) -> float:
        if name in CATEGORIES:
            return self.shares.get(name, 0.0)
        raise AttributeError(name)


@dataclass(frozen=True)
class JobEstimate:
    """Little's law beside the measured mean step interval, the waiting share and f."""

    job_id: int
    job_name: str
    steps: int
    measured_interval_s: float | None
    estimated_interval_s: float | None
    f: float | None
    waiting_share: float | None
    caveat: str
    TABLE: ClassVar[tuple[str, ...]] = (
        "job_id",
        "job_name",
        "steps",
        "measured_interval_s",
        "estimated_interval_s",
        "f",
        "waiting_share",
        "caveat",
    )


@dataclass(frozen=True)
class WaitingShareBucket:
    """One job's waiting share in one bucket: acquisition over trajectory time of the
    trajectories that ended in it (each Sandman acquisition counted once)."""

    job_id: int
    job_name: str
    bucket_start: dt.datetime
    trajectories: int
    trajectory_s: float
    acquisition_s: float
    TABLE: ClassVar[tuple[str, ...]] = (
        "job_id",
        "job_name",
        "bucket_start",
        "trajectories",
        "trajectory_s",
        "acquisition_s",
        "waiting_share",
    )

    @property
    def waiting_share(self) -> float | None:
        return self.acquisition_s / self.trajectory_s if self.trajectory_s > 0 else None


@dataclass(frozen=True)
class EstimateBucket:
    """One job's measured mean step interval and Little's-law estimate in one bucket."""

    job_id: int
    job_name: str
    bucket_start: dt.datetime
    steps: int
    measured_interval_s: float | None
    estimated_interval_s: float | None
    f: float | None
    caveat: str
    TABLE: ClassVar[tuple[str, ...]] = (
        "job_id",
        "job_name",
        "bucket_start",
        "steps",
        "measured_interval_s",
        "estimated_interval_s",
        "f",
        "caveat",
    )
