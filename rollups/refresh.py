"""The rollup refresh: advance the watermark, recompute dirty buckets (a cheap periodic job).

``manage.py refresh_rollups`` runs :func:`rollups_refresh` once or every ``--every`` seconds.

Ordering rules a reader must not break (they are what makes a rollup read equal a raw read):

1. Advancing the watermark takes the exclusive advisory lock :data:`LOCK_KEY`; every trigger
   that marks a bucket takes it shared for its writer's transaction. So the watermark moves
   only between writer transactions: a writer either saw the old watermark and committed
   before the move (its bucket is then recomputed: every bucket passed over is listed
   dirty by the move itself) or sees the new one and marks its bucket dirty.
2. The buckets passed over are listed dirty in the same transaction that moves the
   watermark, so a reader never takes a bucket below the watermark as materialised before
   it is.
3. Recomputing deletes the dirty rows first (``DELETE ... RETURNING``), then rebuilds those
   buckets from raw rows, in one transaction. A writer marks with ``INSERT ... ON CONFLICT
   DO UPDATE``, which locks the dirty row until the writer commits, so the DELETE waits for
   it and the rebuild (a later statement) sees its rows; a mark made after the DELETE stays
   listed and the bucket is read raw until the next refresh.
4. The bucket holding ``now`` is never materialised (it is still filling).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import connection, transaction

from rollups.families import FAMILIES
from rollups.models import BUCKET_S, RollupState

LOCK_KEY = 7_160_171  # pg advisory lock key of the rollup watermark
MAX_BUCKETS_PER_PASS = 2000
_RAW_TIMES = (
    "SELECT MIN(requested_at) FROM sandboxes_sandbox",
    "SELECT MIN(ready_at) FROM sandboxes_sandbox",
    "SELECT MIN(COALESCE(scheduled_at, requested_at)) FROM sandboxes_sandbox",
    "SELECT MIN(finished_at) FROM sandboxes_acquisition",
)


@dataclass(frozen=True)
class RefreshCounts:
    watermark: int
    buckets: int
    rows: int


def _bucket(at: dt.datetime) -> int:
    return int(at.timestamp() * 1000 // (BUCKET_S * 1000))


def _first_raw_bucket(cursor: object) -> int | None:
    found = []
    for sql in _RAW_TIMES:
        cursor.execute(sql)  # type: ignore[attr-defined]
        value = cursor.fetchone()[0]  # type: ignore[attr-defined]
        if value is not None:
            found.append(_bucket(value))
    return min(found) if found else None


def _advance(now: dt.datetime) -> int:
    target = _bucket(now)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])
        state, _ = RollupState.objects.select_for_update().get_or_create(pk=1)
        start = state.watermark
        if start == 0:
            first = _first_raw_bucket(cursor)
            start = target if first is None else min(first, target)
        if target > start or state.watermark == 0:
            cursor.execute(
                "INSERT INTO rollups_rollupdirty (bucket, marks) "
                "SELECT b, 1 FROM generate_series(%s::bigint, %s::bigint - 1) AS b "
                "ON CONFLICT (bucket) DO NOTHING",
                [start, target],
            )
            state.watermark = max(target, state.watermark)
        state.refreshed_at = now
        state.save()
        return state.watermark


def _runs(buckets: list[int]) -> list[tuple[dt.datetime, dt.datetime]]:
    """Contiguous runs of bucket indexes as ``[lo, hi)`` datetimes (index-friendly ranges)."""
    runs: list[tuple[int, int]] = []
    for b in sorted(buckets):
        if runs and runs[-1][1] == b:
            runs[-1] = (runs[-1][0], b + 1)
        else:
            runs.append((b, b + 1))
    return [
        (
            dt.datetime.fromtimestamp(lo * BUCKET_S, tz=dt.UTC),
            dt.datetime.fromtimestamp(hi * BUCKET_S, tz=dt.UTC),
        )
        for lo, hi in runs
    ]


def _rebuild(limit: int) -> tuple[int, int]:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM rollups_rollupdirty WHERE bucket IN ("
            "SELECT bucket FROM rollups_rollupdirty ORDER BY bucket LIMIT %s) RETURNING bucket",
            [limit],
        )
        buckets = [int(row[0]) for row in cursor.fetchall()]
        if not buckets:
            return 0, 0
        ranges = _runs(buckets)
        rows = 0
        for family in FAMILIES:
            cursor.execute(f"DELETE FROM {family.table} WHERE bucket = ANY(%s)", [buckets])
            sql, params = family.source_sql(ranges)
            cursor.execute(
                f"INSERT INTO {family.table} ({', '.join(family.columns)}) {sql}", params
            )
            rows += max(cursor.rowcount, 0)
        return len(buckets), rows


def rollups_refresh(*, now: dt.datetime, limit: int = MAX_BUCKETS_PER_PASS) -> RefreshCounts:
    """Advance the watermark to ``now``'s bucket and rebuild every dirty bucket; idempotent.

    On engines other than PostgreSQL (the embedded SQLite default) there are no rollups and
    nothing happens: the charts read raw rows there."""
    if connection.vendor != "postgresql":
        return RefreshCounts(watermark=0, buckets=0, rows=0)
    watermark = _advance(now)
    buckets = rows = 0
    while True:
        done, written = _rebuild(limit)
        buckets += done
        rows += written
        if done < limit:
            break
    return RefreshCounts(watermark=watermark, buckets=buckets, rows=rows)


def rollups_reset() -> None:
    """Forget every rollup row (the next refresh rebuilds them all from raw rows): after a
    change to the bins or the families' SQL. Takes the watermark lock like a move."""
    if connection.vendor != "postgresql":
        return
    tables = ", ".join(f.table for f in FAMILIES)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_KEY])
        cursor.execute(f"TRUNCATE {tables}, rollups_rollupdirty")
        RollupState.objects.update_or_create(pk=1, defaults={"watermark": 0})
