"""Reads behind the training page's charts over time: waiting share and Little's law per bucket.

Everything is summed in SQL, one row per (job, bucket) back to Python (CONVENTIONS
"Dashboards aggregate in the database"); the jobs are the ones the page shows
(``selectors.training.shown_jobs``: the filter's top N by steps in the window).

Definitions (the captions say the same):
* *Waiting share* of a bucket: summed acquisition phases over summed trajectory time of the
  job's trajectories that ENDED in the bucket. A phase Sandman recorded itself
  (``from_sandman``) is counted once per distinct ``(start, end)``, as one create shared by
  several trajectories is one wait (``sandboxes.training_selectors.waiting_share``).
* *Little's law* per bucket: trajectories per step (consumed trajectories ending in the
  bucket over steps whose training ended in it) × mean trajectory time (every attempt
  ending in it, failed ones included, over the consumed) ÷ mean trajectories in flight (the
  job's trajectory time clipped to the bucket, over the bucket's width), beside the measured
  mean step interval of those steps; f = (acquisition + failed attempts) over trajectory
  time. A model output from sums, not a measurement (``LITTLE_CAVEAT``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Avg, Count, ExpressionWrapper, F, FloatField, Q, QuerySet, Sum

from dashboards.filters import ChartFilter
from dashboards.rows.training import EstimateBucket, WaitingShareBucket
from dashboards.selectors.training import shown_jobs
from dashboards.sql import FloorDiv, raw_rows
from dashboards.window import bucket_start
from sandboxes.critical_path import LITTLE_CAVEAT, fixed_concurrency_estimate
from sandboxes.models import LearnerStep, Trajectory, TrajectoryPhase

_ACQUISITION = ("rollout_acquisition", "grading_acquisition")
Key = tuple[int, int]  # (job id, bucket index)


def _duration() -> ExpressionWrapper:
    return ExpressionWrapper(F("end") - F("start"), output_field=FloatField())


def _ended_in(flt: ChartFilter, job_ids: Sequence[int]) -> QuerySet[Trajectory]:
    lo, hi = flt.window.since.timestamp(), flt.window.until.timestamp()
    return Trajectory.objects.filter(job_id__in=job_ids, end__gte=lo, end__lt=hi)


def _trajectory_sums(flt: ChartFilter, job_ids: Sequence[int]) -> dict[Key, dict[str, Any]]:
    """Per (job, bucket): attempts, consumed, seconds and failed seconds (once per request)."""
    return flt.remember("training_time.sums", lambda: _sum_trajectories(flt, job_ids))


def _sum_trajectories(flt: ChartFilter, job_ids: Sequence[int]) -> dict[Key, dict[str, Any]]:
    rows = (
        _ended_in(flt, job_ids)
        .order_by()
        .annotate(tt_bucket=FloorDiv(F("end"), flt.window.bucket_s))
        .values("job_id", "tt_bucket")
        .annotate(
            tt_n=Count("pk"),
            tt_consumed=Count("pk", filter=Q(failed=False)),
            tt_s=Sum(_duration()),
            tt_lost=Sum(_duration(), filter=Q(failed=True)),
        )
    )
    return {(r["job_id"], int(r["tt_bucket"])): r for r in rows}


def _acquisition_sums(flt: ChartFilter, job_ids: Sequence[int]) -> dict[Key, float]:
    """Trainer-timed acquisition phases summed; Sandman-timed ones once per (start, end)."""
    return flt.remember("training_time.acquisition", lambda: _sum_acquisition(flt, job_ids))


def _sum_acquisition(flt: ChartFilter, job_ids: Sequence[int]) -> dict[Key, float]:
    phases = TrajectoryPhase.objects.filter(
        trajectory__in=_ended_in(flt, job_ids), kind__in=_ACQUISITION
    ).annotate(
        tt_job=F("trajectory__job_id"),
        tt_bucket=FloorDiv(F("trajectory__end"), flt.window.bucket_s),
    )
    out: dict[Key, float] = {}
    trainer = (
        phases.filter(from_sandman=False)
        .order_by()
        .values("tt_job", "tt_bucket")
        .annotate(tt_s=Sum(_duration()))
    )
    for r in trainer:
        out[(r["tt_job"], int(r["tt_bucket"]))] = float(r["tt_s"] or 0.0)
    distinct = (
        phases.filter(from_sandman=True)
        .order_by()
        .annotate(tt_start=F("start"), tt_end=F("end"))
        .values_list("tt_job", "tt_bucket", "tt_start", "tt_end")
        .distinct()
    )
    inner_sql, params = distinct.query.sql_with_params()
    for job_id, bucket, seconds in raw_rows(
        "SELECT tt_job, tt_bucket, SUM(tt_end - tt_start) FROM "
        f"({inner_sql}) tt_once GROUP BY tt_job, tt_bucket",
        params,
    ):
        key = (int(job_id), int(bucket))
        out[key] = out.get(key, 0.0) + float(seconds or 0.0)
    return out


def waiting_share_over_time(flt: ChartFilter) -> list[WaitingShareBucket]:
    """Per shown job and bucket of trajectory end: acquisition over trajectory time."""
    jobs = dict(shown_jobs(flt))
    if not jobs:
        return []
    sums = _trajectory_sums(flt, list(jobs))
    acquisition = _acquisition_sums(flt, list(jobs))
    return [
        WaitingShareBucket(
            job_id=job_id,
            job_name=jobs[job_id],
            bucket_start=bucket_start(bucket, flt.window.bucket_s),
            trajectories=int(row["tt_n"]),
            trajectory_s=float(row["tt_s"] or 0.0),
            acquisition_s=acquisition.get((job_id, bucket), 0.0),
        )
        for (job_id, bucket), row in sorted(sums.items(), key=lambda kv: (kv[0][1], kv[0][0]))
    ]


def _in_flight(flt: ChartFilter, job_ids: Sequence[int]) -> dict[Key, float]:
    """Each job's trajectory time clipped to each bucket: one join with the bucket list."""
    window, width = flt.window, float(flt.window.bucket_s)
    first = int(window.since.timestamp() // width)
    last = int(window.until.timestamp() // width)
    if connection.vendor == "postgresql":
        return _in_flight_series(job_ids, first, last, width)
    buckets = list(range(first, last + 1))
    # Portable (SQLite has no VALUES column aliases): a UNION ALL of one-row SELECTs.
    series = " UNION ALL ".join("SELECT %s AS b, %s AS lo, %s AS hi" for _ in buckets)
    params: list[Any] = []
    for b in buckets:
        params.extend([b, b * width, (b + 1) * width])
    table = Trajectory._meta.db_table
    marks = ", ".join("%s" for _ in job_ids)
    sql = (
        'SELECT t.job_id, s.b, SUM((CASE WHEN t."end" < s.hi THEN t."end" ELSE s.hi END)'
        " - (CASE WHEN t.start > s.lo THEN t.start ELSE s.lo END))"
        f' FROM {table} t JOIN ({series}) s ON t."end" > s.lo AND t.start < s.hi'
        f' WHERE t.job_id IN ({marks}) AND t."end" > %s AND t.start < %s'
        " GROUP BY t.job_id, s.b"
    )
    params.extend([*job_ids, first * width, (last + 1) * width])
    return {(int(j), int(b)): float(s or 0.0) for j, b, s in raw_rows(sql, params)}


def _in_flight_series(
    job_ids: Sequence[int], first: int, last: int, width: float
) -> dict[Key, float]:
    """:func:`_in_flight` on PostgreSQL: each trajectory joined only with the buckets it
    spans (``generate_series``), not every trajectory with every bucket."""
    table = Trajectory._meta.db_table
    marks = ", ".join("%s" for _ in job_ids)
    sql = (
        'SELECT t.job_id, s.b, SUM(LEAST(t."end", (s.b + 1) * %s) - GREATEST(t.start, s.b * %s))'
        f" FROM {table} t CROSS JOIN LATERAL generate_series("
        "GREATEST(CAST(FLOOR(t.start / %s) AS BIGINT), %s), "
        'LEAST(CAST(FLOOR(t."end" / %s) AS BIGINT), %s)) AS s(b)'
        f' WHERE t.job_id IN ({marks}) AND t."end" > %s AND t.start < %s'
        ' AND t."end" > s.b * %s AND t.start < (s.b + 1) * %s'
        " GROUP BY t.job_id, s.b"
    )
    params = [width, width, width, first, width, last, *job_ids, first * width]
    params += [(last + 1) * width, width, width]
    return {(int(j), int(b)): float(v or 0.0) for j, b, v in raw_rows(sql, params)}


def estimate_over_time(flt: ChartFilter) -> list[EstimateBucket]:
    """Per shown job and bucket of step end: the measured mean interval and the estimate."""
    jobs = dict(shown_jobs(flt))
    if not jobs:
        return []
    lo, hi = flt.window.since.timestamp(), flt.window.until.timestamp()
    steps = (
        LearnerStep.objects.filter(job_id__in=list(jobs), train_end__gte=lo, train_end__lt=hi)
        .order_by()
        .annotate(tt_bucket=FloorDiv(F("train_end"), flt.window.bucket_s))
        .values("job_id", "tt_bucket")
        .annotate(
            tt_n=Count("pk"),
            tt_mean=Avg(
                ExpressionWrapper(F("train_end") - F("wait_start"), output_field=FloatField())
            ),
        )
    )
    sums = _trajectory_sums(flt, list(jobs))
    acquisition = _acquisition_sums(flt, list(jobs))
    in_flight = _in_flight(flt, list(jobs))
    out = []
    for row in steps:
        key = (row["job_id"], int(row["tt_bucket"]))
        traj = sums.get(key, {})
        seconds = float(traj.get("tt_s") or 0.0)
        estimate = fixed_concurrency_estimate(
            steps=int(row["tt_n"]),
            trajectories_consumed=int(traj.get("tt_consumed") or 0),
            trajectory_seconds=seconds,
            in_flight_seconds=in_flight.get(key, 0.0),
            span_seconds=float(flt.window.bucket_s),
            measured_interval_s=float(row["tt_mean"]),
            sandbox_seconds=acquisition.get(key, 0.0) + float(traj.get("tt_lost") or 0.0),
        )
        out.append(
            EstimateBucket(
                job_id=key[0],
                job_name=jobs[key[0]],
                bucket_start=bucket_start(key[1], flt.window.bucket_s),
                steps=int(row["tt_n"]),
                measured_interval_s=float(row["tt_mean"]),
                estimated_interval_s=estimate.estimated_interval_s if estimate else None,
                f=estimate.f if estimate else None,
                caveat=LITTLE_CAVEAT,
            )
        )
    return sorted(out, key=lambda r: (r.bucket_start, r.job_id))
