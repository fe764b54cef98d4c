"""Threshold and burst arithmetic for the detectors, free of Django and of the clock.

Detectors hand in one ``MinuteCount`` per UTC minute (already aggregated by the
database) and get back ``Burst``es: runs of minutes over the threshold, where two flagged
minutes belong to the same burst when the gap between them is at most ``merge_gap``.
Invariants: bursts come out sorted by start, never overlap, and a burst's ``end`` is the
exclusive end of its last flagged minute. Only flagged minutes count toward a burst's
totals, so re-running over the same rows gives the same bursts (the detectors' idempotence
rests on that).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

MINUTE = timedelta(minutes=1)


@dataclass(frozen=True)
class MinuteCount:
    minute: datetime  # start of a UTC minute
    hits: int  # e.g. creates answered 5xx
    total: int  # e.g. all creates; 0 for count-only detectors

    @property
    def share(self) -> float:
        return self.hits / self.total if self.total else 0.0


@dataclass(frozen=True)
class Burst:
    start: datetime
    end: datetime  # exclusive
    minutes: tuple[MinuteCount, ...] = field(default=())

    @property
    def hits(self) -> int:
        return sum(m.hits for m in self.minutes)

    @property
    def total(self) -> int:
        return sum(m.total for m in self.minutes)


def over_share(rows: Iterable[MinuteCount], *, share: float, min_hits: int) -> list[MinuteCount]:
    """Minutes whose hit share reaches ``share`` with at least ``min_hits`` hits."""
    return [r for r in rows if r.total > 0 and r.hits >= min_hits and r.share >= share]


def over_count(rows: Iterable[MinuteCount], *, min_hits: int) -> list[MinuteCount]:
    """Minutes with at least ``min_hits`` hits (count-only detectors)."""
    return [r for r in rows if r.hits >= min_hits]


def group_bursts(minutes: Iterable[MinuteCount], *, merge_gap: timedelta) -> list[Burst]:
    """Join flagged minutes into bursts; a quiet gap longer than ``merge_gap`` splits them."""
    ordered = sorted(minutes, key=lambda m: m.minute)
    bursts: list[Burst] = []
    current: list[MinuteCount] = []
    for row in ordered:
        if current and row.minute - (current[-1].minute + MINUTE) > merge_gap:
            bursts.append(_burst(current))
            current = []
        current.append(row)
    if current:
        bursts.append(_burst(current))
    return bursts


def _burst(rows: list[MinuteCount]) -> Burst:
    return Burst(start=rows[0].minute, end=rows[-1].minute + MINUTE, minutes=tuple(rows))


def minute_key(minute: datetime) -> str:
    """The window name stored on an incident: the burst's first minute, ISO, UTC."""
    return minute.strftime("%Y-%m-%dT%H:%MZ")
