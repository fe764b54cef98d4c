"""Chart reads served from the rollups (plus the raw rows of the buckets a plan reads raw).

Each function takes a :class:`~rollups.plan.Plan` (from ``window_plan``), the window's chart
bucket width and the filter's :class:`~rollups.families.Scope`, and returns plain tuples
that ``dashboards.selectors`` turns into their row shapes. Aggregation is SQL (one UNION ALL
of the stored rows and the raw rows' same aggregate, summed per group); only percentiles
are finished in Python from the per-bin counts (``rollups.bins``: within 5 % or 1 ms).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from django.db import connection, transaction

from rollups import bins
from rollups.families import (
    ACQUISITIONS,
    ADDRESS,
    ALL,
    CREATES,
    NODES,
    READY,
    WAITS,
    Family,
    Scope,
)
from rollups.models import BUCKET_S
from rollups.plan import Plan

# A month's stored rows are grouped per (node, chart bucket) and similar: ~12k groups
# whose width PostgreSQL estimates from varchar(253), so under the default 4 MB it sorts
# ~280k rows on disk instead of hashing them (twice the time). Raised for these reads only.
READ_WORK_MEM = "32MB"


def _rows(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL work_mem = '{READ_WORK_MEM}'")
        cursor.execute(sql, params)
        return cursor.fetchall()


def _stored(family: Family, plan: Plan, scope: Scope, extra: str = "") -> tuple[str, list]:
    params: list[Any] = []
    runs = []
    for lo, hi in plan.rolled:
        runs.append("(bucket >= %s AND bucket < %s)")
        params.extend([lo, hi])
    clauses = [f"({' OR '.join(runs)})" if runs else "FALSE"]
    if scope.job_ids and not extra:
        clauses.append(f"job_id IN ({', '.join('%s' for _ in scope.job_ids)})")
        params.extend(scope.job_ids)
    if scope.backend and not extra:
        clauses.append("backend = %s")
        params.append(scope.backend)
    if extra:
        clauses.append(extra)
    sql = f"SELECT {', '.join(family.columns)} FROM {family.table} WHERE {' AND '.join(clauses)}"
    return sql, params


def _union(family: Family, plan: Plan, scope: Scope) -> tuple[str, list]:
    """Stored rows plus the raw rows' same aggregate, at the level the scope reads: per-job
    rows when jobs are chosen, else the all-jobs rows of the backend (or of all backends)."""
    cols = ", ".join(family.columns)
    if not family.measures:
        stored_sql, stored_params = _stored(family, plan, scope)
        raw_sql, raw_params = family.source_sql(plan.raw, scope)
        return (
            f"(({stored_sql}) UNION ALL ({raw_sql})) AS u({cols})",
            [*stored_params, *raw_params],
        )
    if scope.job_ids:
        level = f"job_id IN ({', '.join('%s' for _ in scope.job_ids)})"
        level_params: list[Any] = [*scope.job_ids]
        if scope.backend:
            level += " AND backend = %s"
            level_params.append(scope.backend)
    else:
        level, level_params = "job_id IS NULL AND backend = %s", [scope.backend or ALL]
    stored_sql, stored_params = _stored(family, plan, scope, extra=level)
    raw_sql, raw_params = family.source_sql(plan.raw, scope)
    return (
        f"(({stored_sql}) UNION ALL (SELECT * FROM ({raw_sql}) AS r({cols}) WHERE {level})) "
        f"AS u({cols})",
        [*stored_params, *level_params, *raw_params, *level_params],
    )


def _per(bucket_s: int) -> int:
    return bucket_s // BUCKET_S


def ready_bins(plan: Plan, bucket_s: int, scope: Scope) -> dict[int, list[tuple[int, int]]]:
    """``{chart bucket: [(bin, n)]}`` of create-to-Ready by bucket of ``ready_at``."""
    source, params = _union(READY, plan, scope)
    out: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for b, bin_, n in _rows(
        f"SELECT bucket / {_per(bucket_s)}, bin, SUM(n) FROM {source} GROUP BY 1, 2", params
    ):
        out[int(b)].append((int(bin_), int(n)))
    return out


def ready_bins_by_image(plan: Plan, scope: Scope) -> dict[str, list[tuple[int, int]]]:
    source, params = _union(READY, plan, scope)
    out: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for image, bin_, n in _rows(f"SELECT image, bin, SUM(n) FROM {source} GROUP BY 1, 2", params):
        out[str(image)].append((int(bin_), int(n)))
    return out


def creates(plan: Plan, bucket_s: int, scope: Scope) -> list[tuple[int, int, int]] | None:
    """``[(chart bucket, creates, busiest second)]``, or None for several jobs (the busiest
    second of a set of jobs is not stored: the caller reads raw rows)."""
    if len(scope.job_ids) > 1:
        return None
    job = "job_id IS NULL" if not scope.job_ids else "job_id = %s"
    level = f"{job} AND backend = %s"
    level_params: list[Any] = [*scope.job_ids, scope.backend]
    stored_sql, stored_params = _stored(CREATES, plan, scope, extra=level)
    stored_params = [*stored_params, *level_params]
    raw_sql, raw_params = CREATES.source_sql(plan.raw, scope)
    cols = ", ".join(CREATES.columns)
    sql = (
        f"SELECT bucket / {_per(bucket_s)}, SUM(n), MAX(peak_per_s) FROM (({stored_sql}) "
        f"UNION ALL (SELECT * FROM ({raw_sql}) AS r({cols}) WHERE {level})) AS u({cols}) "
        "GROUP BY 1 ORDER BY 1"
    )
    rows = _rows(sql, [*stored_params, *raw_params, *level_params])
    return [(int(b), int(n), int(peak)) for b, n, peak in rows]


def wait_bins(
    plan: Plan, bucket_s: int, scope: Scope
) -> dict[tuple[int, str], list[tuple[int, int]]]:
    """``{(chart bucket, "wait"|"queue"): [(bin, n)]}`` by bucket of ``finished_at``."""
    source, params = _union(WAITS, plan, scope)
    out: dict[tuple[int, str], list[tuple[int, int]]] = defaultdict(list)
    for b, metric, bin_, n in _rows(
        f"SELECT bucket / {_per(bucket_s)}, metric, bin, SUM(n) FROM {source} GROUP BY 1, 2, 3",
        params,
    ):
        out[(int(b), str(metric))].append((int(bin_), int(n)))
    return out


def acquisitions_by_job(
    plan: Plan, scope: Scope, *, by_key: bool
) -> list[tuple[int, str, str, dict[str, int]]]:
    """Successful acquisitions per job (and key): ``[(job, name, key, {source: n})]``."""
    source, params = _union(ACQUISITIONS, plan, scope)
    key = "u.key_hash" if by_key else "CAST('' AS VARCHAR)"
    # Summed per (job, key, source) first, the job's name joined to the few sums after: a
    # month at 30-minute grain is ~400k rows, and grouping them with the name was the cost.
    rows = _rows(
        "SELECT s.job_id, j.name, s.key_hash, s.source, s.n FROM ("
        f"SELECT u.job_id, {key} AS key_hash, u.source, SUM(u.n) AS n FROM {source} "
        "WHERE u.outcome = 'ok' GROUP BY 1, 2, 3) AS s "
        "JOIN sandboxes_job j ON j.id = s.job_id ORDER BY s.job_id",
        params,
    )
    out: dict[tuple[int, str, str], dict[str, int]] = {}
    for job_id, name, key_hash, src, n in rows:
        out.setdefault((int(job_id), str(name), str(key_hash)), {})[str(src)] = int(n)
    return [(j, name, k, counts) for (j, name, k), counts in sorted(out.items())]


def address_failures(plan: Plan, bucket_s: int, scope: Scope) -> list[tuple[int, int, int, int]]:
    """``[(chart bucket, sandboxes, failures, unknown)]`` by bucket of scheduled (requested)."""
    source, params = _union(ADDRESS, plan, scope)
    rows = _rows(
        f"SELECT bucket / {_per(bucket_s)}, SUM(n), SUM(failures), SUM(unknown) FROM {source} "
        "GROUP BY 1 ORDER BY 1",
        params,
    )
    return [(int(b), int(n), int(f), int(u)) for b, n, f, u in rows]


def node_load(plan: Plan, bucket_s: int, scope: Scope) -> list[tuple[int, int, int, int]]:
    """``[(load, sandboxes, failures, unknown)]``: load = sandboxes per (node, chart bucket)."""
    source, params = _union(NODES, plan, scope)
    rows = _rows(
        "SELECT load, SUM(load), SUM(f), SUM(u) FROM ("
        f"SELECT node, bucket / {_per(bucket_s)}, SUM(n) AS load, SUM(failures) AS f, "
        f"SUM(unknown) AS u FROM {source} GROUP BY 1, 2) per_node GROUP BY load ORDER BY load",
        params,
    )
    return [(int(load), int(n), int(f), int(u)) for load, n, f, u in rows]


def percentiles(
    counts: Sequence[tuple[int, int]], fractions: Sequence[float]
) -> tuple[int, tuple[float | None, ...]]:
    return bins.percentiles(counts, fractions)
