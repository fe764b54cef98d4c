"""The time range an operator page shows: ``minutes`` from the URL, cut into buckets.

Pure (no Django). Time is a parameter: :func:`window_ending` takes the caller's ``now``
(the page reads the clock once, at the edge); nothing here reads the clock. The bucket is
the smallest width of :data:`BUCKET_LADDER_S` giving at most :data:`MAX_POINTS` points, so
every time-series chart of a page shares one bucket width.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sandman_site.errors import InvalidInput

# Bucket widths (seconds) the time-series charts may use: about 60 points per window.
_HOURS = (3600, 7200, 10800, 21600, 43200, 86400)
BUCKET_LADDER_S = (10, 15, 30, 60, 120, 300, 600, 900, 1800, *_HOURS)
MAX_POINTS = 60
DEFAULT_MINUTES = 60
MAX_MINUTES = 31 * 24 * 60  # a month of records (issue 11)
WINDOW_CHOICES = (15, 60, 360, 1440)


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
    return window_between(since=now - dt.timedelta(minutes=minutes), until=now)


def window_between(*, since: dt.datetime, until: dt.datetime) -> Window:
    """``[since, until)`` with the smallest ladder bucket giving ≤60 points."""
    span_s = (until - since).total_seconds()
    if span_s < 60:
        raise ValueError("a window is at least one minute")
    bucket_s = next((b for b in BUCKET_LADDER_S if span_s / b <= MAX_POINTS), BUCKET_LADDER_S[-1])
    return Window(since=since, until=until, bucket_s=bucket_s)


def parse_minutes(raw: str | None) -> int:
    """The ``minutes`` query parameter: blank means the default; else an int in [1, MAX]."""
    if raw is None or raw == "":
        return DEFAULT_MINUTES
    try:
        minutes = int(raw)
    except ValueError:
        raise InvalidInput(f"minutes must be a whole number, got {raw[:40]!r}.") from None
    if not 1 <= minutes <= MAX_MINUTES:
        raise InvalidInput(f"minutes must be between 1 and {MAX_MINUTES}, got {minutes}.")
    return minutes


def bucket_start(index: int, bucket_s: int) -> dt.datetime:
    """The UTC start of epoch bucket ``index`` (what ``sql.epoch_bucket`` returns)."""
    return dt.datetime.fromtimestamp(int(index) * bucket_s, tz=dt.UTC)
