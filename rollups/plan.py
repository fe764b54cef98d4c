"""Which part of a chart window is read from the rollups and which from the raw rows.

A window is served from the rollups only on PostgreSQL and only when its chart bucket is a
whole number of rollup buckets (``bucket_s % BUCKET_S == 0``: windows over 15 hours);
shorter windows read raw rows with exact percentiles. Inside a served window the whole
rollup buckets below the watermark and not dirty are read from the rollup tables; the
partial buckets at both edges, the dirty ones and everything from the watermark on are read
raw, binned by the same SQL (``rollups.families``), and the two parts are summed.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from django.db import connection

from rollups.models import BUCKET_S, RollupDirty, RollupState


@dataclass(frozen=True)
class Plan:
    """Rollup buckets to read (``[lo, hi)`` index runs) and raw time ranges to read."""

    rolled: tuple[tuple[int, int], ...]
    raw: tuple[tuple[dt.datetime, dt.datetime], ...]


def _at(bucket: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(bucket * BUCKET_S, tz=dt.UTC)


def window_plan(since: dt.datetime, until: dt.datetime, bucket_s: int) -> Plan | None:
    """The plan of ``[since, until)`` charted in ``bucket_s`` buckets, or None (read raw)."""
    if connection.vendor != "postgresql" or bucket_s % BUCKET_S != 0:
        return None
    state = RollupState.objects.filter(pk=1).values_list("watermark", flat=True).first()
    if not state:
        return None
    first = math.ceil(since.timestamp() / BUCKET_S)
    last = min(math.floor(until.timestamp() / BUCKET_S), int(state))
    if first >= last:
        return Plan(rolled=(), raw=((since, until),))
    dirty = set(
        RollupDirty.objects.filter(bucket__gte=first, bucket__lt=last).values_list(
            "bucket", flat=True
        )
    )
    rolled: list[tuple[int, int]] = []
    raw: list[tuple[dt.datetime, dt.datetime]] = []
    cursor = since
    for b in range(first, last):
        if b in dirty:
            continue
        if rolled and rolled[-1][1] == b:
            rolled[-1] = (rolled[-1][0], b + 1)
        else:
            if _at(b) > cursor:
                raw.append((cursor, _at(b)))
            rolled.append((b, b + 1))
        cursor = _at(b + 1)
    if until > cursor:
        raw.append((cursor, until))
    return Plan(rolled=tuple(rolled), raw=tuple(raw))
