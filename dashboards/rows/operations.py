"""Row shapes of the operations page (``/operations/``): what ``selectors.operations``
returns and ``figures.operations`` draws.

Pure (no Django), like ``rows.overview``: frozen dataclasses, each with the columns of its
data table and CSV (``TABLE``). Times are tz-aware UTC; durations are hours here, since
pod-hours and GPU-hours are what the operators compare.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class AddressFailureBucket:
    """Address failures of the sandboxes scheduled (else requested) in one bucket."""

    bucket_start: dt.datetime
    bucket_s: int
    sandboxes: int
    address_failures: int
    unknown: int = 0  # sandboxes no Event told about: not counted as 0 failures
    TABLE: ClassVar[tuple[str, ...]] = (
        "bucket_start",
        "bucket_s",
        "sandboxes",
        "address_failures",
        "unknown",
        "failures_per_min",
    )

    @property
    def failures_per_min(self) -> float:
        return self.address_failures * 60 / self.bucket_s


@dataclass(frozen=True)
class AddressFailureLoad:
    """Sandboxes whose node held ``node_load`` sandboxes (approximation: see the selector)."""

    node_load: int
    sandboxes: int
    address_failures: int
    unknown: int = 0  # sandboxes no Event told about: left out of the per-sandbox rate
    TABLE: ClassVar[tuple[str, ...]] = (
        "node_load",
        "sandboxes",
        "address_failures",
        "unknown",
        "failures_per_sandbox",
    )

    @property
    def failures_per_sandbox(self) -> float | None:
        known = self.sandboxes - self.unknown
        return self.address_failures / known if known > 0 else None


@dataclass(frozen=True)
class WarmKey:
    """Warm-pool use of one (job, key): hit rate of its acquisitions and idle warm time."""

    job_id: int | None  # None: the "others" row (the (job, key) pairs beyond the top N)
    job_name: str
    key_hash: str
    hits: int
    acquisitions: int
    warm_pods: int
    idle_pod_hours: float
    TABLE: ClassVar[tuple[str, ...]] = (
        "job_id",
        "job_name",
        "key_hash",
        "hits",
        "acquisitions",
        "hit_rate",
        "warm_pods",
        "idle_pod_hours",
    )

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.acquisitions if self.acquisitions else None

    @property
    def label(self) -> str:
        if self.job_id is None:
            return self.job_name
        return f"{self.job_name} (#{self.job_id}) · {self.key_hash[:8]}"


@dataclass(frozen=True)
class IncidentClassHours:
    """GPU-hour bounds of one root-cause class on one path (Table A49)."""

    path: str  # "sandbox" | "outside"
    cause_class: str
    label: str
    cases: int
    gpu_hours_low: float
    gpu_hours_high: float
    TABLE: ClassVar[tuple[str, ...]] = (
        "path",
        "cause_class",
        "label",
        "cases",
        "gpu_hours_low",
        "gpu_hours_high",
    )


@dataclass(frozen=True)
class AddressFailureRow:
    """One line of the address-failure table: both views in one long table (one CSV).

    ``view`` is ``per_minute`` (``bucket_start`` set, ``rate`` = failures per minute) or
    ``by_node_load`` (``node_load`` set, ``rate`` = failures per sandbox). ``unknown``
    counts the sandboxes no Event told about (left out of the rate, never read as 0).
    """

    view: str
    bucket_start: dt.datetime | None
    node_load: int | None
    sandboxes: int
    address_failures: int
    rate: float | None
    unknown: int = 0
    TABLE: ClassVar[tuple[str, ...]] = (
        "view",
        "bucket_start",
        "node_load",
        "sandboxes",
        "address_failures",
        "unknown",
        "rate",
    )


def address_failure_table(
    per_minute: list[AddressFailureBucket], by_load: list[AddressFailureLoad]
) -> list[AddressFailureRow]:
    rows = [
        AddressFailureRow(
            "per_minute",
            r.bucket_start,
            None,
            r.sandboxes,
            r.address_failures,
            r.failures_per_min,
            r.unknown,
        )
        for r in per_minute
    ]
    rows.extend(
        AddressFailureRow(
            "by_node_load",
            None,
            r.node_load,
            r.sandboxes,
            r.address_failures,
            r.failures_per_sandbox,
            r.unknown,
        )
        for r in by_load
    )
    return rows
