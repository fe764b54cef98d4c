"""Each rollup table's SQL over the raw rows, shared by the refresh and by rollup reads.

PostgreSQL only. :func:`source_sql` of a family yields exactly the table's columns from the
raw rows whose time falls in the given ranges, optionally narrowed by job and backend: the
refresh inserts it as it is; a read unions it (for the buckets it must read raw) with the
stored rows, so both sides bin and bucket with one SQL text and cannot drift apart.

Time expressions match ``dashboards.sql``: ``EpochMs`` (milliseconds as DOUBLE PRECISION),
floored by the bucket width, so a rollup bucket lines up with a chart bucket whose width is
a multiple of ``BUCKET_S``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rollups.bins import bin_sql
from rollups.models import BUCKET_S

Ranges = Sequence[tuple[dt.datetime, dt.datetime]]


def epoch_ms(column: str) -> str:
    return f"CAST(EXTRACT(EPOCH FROM {column}) * 1000 AS DOUBLE PRECISION)"


def bucket_of(column: str, width_s: int = BUCKET_S) -> str:
    return f"CAST(FLOOR({epoch_ms(column)} / {float(width_s * 1000)!r}) AS BIGINT)"


def duration_ms(end: str, start: str) -> str:
    return f"CAST(EXTRACT(EPOCH FROM ({end} - {start})) * 1000 AS DOUBLE PRECISION)"


@dataclass(frozen=True)
class Scope:
    """What a read narrows the raw rows to (the chart filter's jobs and backend)."""

    job_ids: tuple[int, ...] = ()
    backend: str = ""


def _where(time: str, ranges: Ranges, scope: Scope, job: str, backend: str) -> tuple[str, list]:
    params: list[Any] = []
    parts = []
    for lo, hi in ranges:
        parts.append(f"({time} >= %s AND {time} < %s)")
        params.extend([lo, hi])
    clauses = [f"({' OR '.join(parts)})" if parts else "FALSE"]
    if scope.job_ids:
        clauses.append(f"{job} IN ({', '.join('%s' for _ in scope.job_ids)})")
        params.extend(scope.job_ids)
    if scope.backend:
        clauses.append(f"{backend} = %s")
        params.append(scope.backend)
    return " AND ".join(clauses), params


ALL = "*"  # the backend of an all-backends row


@dataclass(frozen=True)
class Family:
    table: str
    columns: tuple[str, ...]  # the table's columns, in the order source_sql yields them
    # Additive columns. When set, source_sql also yields all-jobs rows (job_id NULL) per
    # backend and for all backends (backend ALL), so an unfiltered chart reads a few rows
    # per bucket instead of one per job.
    measures: tuple[str, ...] = ()

    def per_job_sql(self, ranges: Ranges, scope: Scope) -> tuple[str, list]:
        raise NotImplementedError

    def source_sql(self, ranges: Ranges, scope: Scope = Scope()) -> tuple[str, list]:
        sql, params = self.per_job_sql(ranges, scope)
        if not self.measures:
            return sql, params
        dims = [c for c in self.columns if c not in (*self.measures, "job_id", "backend")]
        picks = []
        for c in self.columns:
            if c in self.measures:
                picks.append(f"SUM(i.{c})")
            elif c == "backend":
                picks.append(f"CASE WHEN GROUPING(i.backend) = 1 THEN '{ALL}' ELSE i.backend END")
            else:
                picks.append(f"i.{c}")
        group = ", ".join(f"i.{c}" for c in dims)
        return (
            f"SELECT {', '.join(picks)} FROM ({sql}) AS i({', '.join(self.columns)}) "
            f"GROUP BY {group}, GROUPING SETS ((i.job_id, i.backend), (i.backend), ())",
            params,
        )


class _Ready(Family):
    def per_job_sql(self, ranges: Ranges, scope: Scope) -> tuple[str, list]:
        where, params = _where("s.ready_at", ranges, scope, "s.job_id", "s.backend")
        image = (
            "CASE WHEN s.image_present THEN 'present' WHEN NOT s.image_present THEN 'pulled'"
            " ELSE 'unknown' END"
        )
        sql = (
            f"SELECT {bucket_of('s.ready_at')}, s.job_id, s.backend, {image}, "
            f"{bin_sql(duration_ms('s.ready_at', 's.requested_at'))}, COUNT(*) "
            "FROM sandboxes_sandbox s WHERE s.ready_at >= s.requested_at AND "
            f"{where} GROUP BY 1, 2, 3, 4, 5"
        )
        return sql, params


class _Creates(Family):
    """Per second first (the burst peak), then per bucket, for every (job|all, backend|all)."""

    def source_sql(self, ranges: Ranges, scope: Scope = Scope()) -> tuple[str, list]:
        where, params = _where("s.requested_at", ranges, scope, "s.job_id", "s.backend")
        second = f"CAST(FLOOR({epoch_ms('s.requested_at')} / 1000.0) AS BIGINT)"
        sql = (
            f"SELECT sec / {BUCKET_S}, job_id, COALESCE(backend, ''), SUM(n), MAX(n) FROM ("
            f"SELECT {second} AS sec, s.job_id, s.backend, COUNT(*) AS n, "
            "GROUPING(s.job_id, s.backend) AS g FROM sandboxes_sandbox s "
            f"WHERE {where} GROUP BY {second}, "
            "GROUPING SETS ((s.job_id, s.backend), (s.job_id), (s.backend), ())"
            f") per_second GROUP BY sec / {BUCKET_S}, job_id, backend, g"
        )
        return sql, params


class _Node(Family):
    def per_job_sql(self, ranges: Ranges, scope: Scope) -> tuple[str, list]:
        where, params = _where("s.requested_at", ranges, scope, "s.job_id", "s.backend")
        sql = (
            f"SELECT {bucket_of('s.requested_at')}, s.job_id, s.backend, s.node, COUNT(*), "
            "COALESCE(SUM(s.address_failures), 0), "
            "COUNT(*) FILTER (WHERE s.address_failures IS NULL) "
            f"FROM sandboxes_sandbox s WHERE s.node <> '' AND {where} GROUP BY 1, 2, 3, 4"
        )
        return sql, params


_SCHEDULED = "COALESCE(s.scheduled_at, s.requested_at)"


class _Address(Family):
    def per_job_sql(self, ranges: Ranges, scope: Scope) -> tuple[str, list]:
        where, params = _where(_SCHEDULED, ranges, scope, "s.job_id", "s.backend")
        sql = (
            f"SELECT {bucket_of(_SCHEDULED)}, s.job_id, s.backend, COUNT(*), "
            "COALESCE(SUM(s.address_failures), 0), "
            "COUNT(*) FILTER (WHERE s.address_failures IS NULL) "
            f"FROM sandboxes_sandbox s WHERE {where} GROUP BY 1, 2, 3"
        )
        return sql, params


_ACQUIRED = (
    "FROM sandboxes_acquisition a LEFT JOIN sandboxes_sandbox s ON s.id = a.sandbox_id WHERE "
)


class _Acquisitions(Family):
    def per_job_sql(self, ranges: Ranges, scope: Scope) -> tuple[str, list]:
        where, params = _where("a.finished_at", ranges, scope, "a.job_id", "s.backend")
        sql = (
            f"SELECT {bucket_of('a.finished_at')}, a.job_id, COALESCE(s.backend, ''), "
            f"a.key_hash, a.outcome, a.source, COUNT(*) {_ACQUIRED}{where} "
            "GROUP BY 1, 2, 3, 4, 5, 6"
        )
        return sql, params


class _Waits(Family):
    def per_job_sql(self, ranges: Ranges, scope: Scope) -> tuple[str, list]:
        where, params = _where("a.finished_at", ranges, scope, "a.job_id", "s.backend")
        parts = []
        for metric in ("wait", "queue"):
            parts.append(
                f"SELECT {bucket_of('a.finished_at')}, a.job_id, COALESCE(s.backend, ''), "
                f"'{metric}', {bin_sql(f'a.{metric}_ms')}, COUNT(*) {_ACQUIRED}"
                f"a.{metric}_ms IS NOT NULL AND {where} GROUP BY 1, 2, 3, 4, 5"
            )
        return " UNION ALL ".join(parts), params + params


READY = _Ready("rollups_readyrollup", ("bucket", "job_id", "backend", "image", "bin", "n"), ("n",))
CREATES = _Creates("rollups_createrollup", ("bucket", "job_id", "backend", "n", "peak_per_s"))
NODES = _Node(
    "rollups_noderollup",
    ("bucket", "job_id", "backend", "node", "n", "failures", "unknown"),
    ("n", "failures", "unknown"),
)
ADDRESS = _Address(
    "rollups_addressrollup",
    ("bucket", "job_id", "backend", "n", "failures", "unknown"),
    ("n", "failures", "unknown"),
)
ACQUISITIONS = _Acquisitions(
    "rollups_acquisitionrollup",
    ("bucket", "job_id", "backend", "key_hash", "outcome", "source", "n"),
)
WAITS = _Waits("rollups_waitrollup", ("bucket", "job_id", "backend", "metric", "bin", "n"), ("n",))
FAMILIES: tuple[Family, ...] = (READY, CREATES, NODES, ADDRESS, ACQUISITIONS, WAITS)
