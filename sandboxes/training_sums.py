"""The waiting share and Little's-law inputs of several jobs in one PostgreSQL query.

``sandboxes.training_selectors.waiting_share`` and ``_estimate`` answer one job with five
queries; the training page shows up to ``top`` jobs, so over a month it spent most of its
time in 5 × N round trips that each scan the same job's trajectories and acquisition
phases. :func:`grouped_sums` computes the same sums for every job at once: one statement,
the jobs' spans and step groups passed as arrays, the job's trajectories and acquisition
phases (the partial index ``phase_acquisition_traj``) scanned once.

Invariant a reader must not break: every sum here is the same SQL predicate and the same
expression as its per-job counterpart (clipping with LEAST/GREATEST, ``from_sandman``
phases counted once per distinct ``(start, end)``, members = trajectories of the steps'
groups), so the two answers agree up to floating-point summation order
(``sandboxes/tests/test_training_sums.py`` compares them). PostgreSQL only (arrays,
``FILTER``); other engines use the per-job queries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection


@dataclass(frozen=True)
class JobSpan:
    """One job's step span ``[lo, hi]`` and the groups its steps admit or drop."""

    job_id: int
    lo: float
    hi: float
    groups: frozenset[str]


@dataclass(frozen=True)
class JobSums:
    """The sums behind one job's waiting share and Little's-law estimate over its span."""

    in_flight_seconds: float  # trajectory time clipped to the span (every attempt)
    acquisition_seconds: float  # acquisition phases clipped, each Sandman create once
    consumed: int  # members that did not fail
    member_seconds: float  # members' slot time, failed attempts included
    lost_seconds: float  # failed members' slot time
    member_acquisition_seconds: float  # acquisition phases of the non-failed members


_SQL = """
WITH spans AS (
    SELECT * FROM unnest(%s::bigint[], %s::float8[], %s::float8[]) AS s(job_id, lo, hi)
),
wanted AS (
    SELECT DISTINCT * FROM unnest(%s::bigint[], %s::text[]) AS w(job_id, grp)
),
per_trajectory AS (
    SELECT t.job_id, t.start, t."end", t.failed, s.lo, s.hi, (w.grp IS NOT NULL) AS member,
           ph.trainer, ph.acquisition
    FROM sandboxes_trajectory t
    JOIN spans s ON s.job_id = t.job_id
    LEFT JOIN wanted w ON w.job_id = t.job_id AND w.grp = t."group"
    LEFT JOIN LATERAL (
        SELECT SUM(LEAST(p."end", s.hi) - GREATEST(p.start, s.lo))
                   FILTER (WHERE NOT p.from_sandman AND p."end" > s.lo AND p.start < s.hi)
                   AS trainer,
               SUM(p."end" - p.start) AS acquisition
        FROM sandboxes_trajectoryphase p
        WHERE p.trajectory_id = t.id AND p.kind IN ('rollout_acquisition', 'grading_acquisition')
    ) AS ph ON TRUE
),
sums AS (
    SELECT job_id,
        SUM(LEAST("end", hi) - GREATEST(start, lo)) FILTER (WHERE "end" > lo AND start < hi)
            AS in_flight,
        SUM(trainer) AS trainer,
        COUNT(*) FILTER (WHERE member AND NOT failed) AS consumed,
        SUM("end" - start) FILTER (WHERE member) AS member_seconds,
        SUM("end" - start) FILTER (WHERE member AND failed) AS lost,
        SUM(acquisition) FILTER (WHERE member AND NOT failed) AS member_acquisition
    FROM per_trajectory GROUP BY job_id
),
once AS (
    SELECT job_id, SUM(LEAST("end", hi) - GREATEST(start, lo)) AS sandman
    FROM (
        SELECT DISTINCT s.job_id, s.lo, s.hi, p.start, p."end"
        FROM sandboxes_trajectoryphase p
        JOIN sandboxes_trajectory t ON t.id = p.trajectory_id
        JOIN spans s ON s.job_id = t.job_id
        WHERE p.kind IN ('rollout_acquisition', 'grading_acquisition')
          AND p.from_sandman AND p."end" > s.lo AND p.start < s.hi
    ) AS distinct_creates
    GROUP BY job_id
)
SELECT s.job_id, x.in_flight, x.trainer, o.sandman, x.consumed, x.member_seconds, x.lost,
       x.member_acquisition
FROM spans s
LEFT JOIN sums x ON x.job_id = s.job_id
LEFT JOIN once o ON o.job_id = s.job_id
"""


def grouped_sums(spans: Sequence[JobSpan]) -> dict[int, JobSums]:
    """Per job id, the sums over its span; one query for all of ``spans`` (PostgreSQL)."""
    if not spans:
        return {}
    member_jobs = [s.job_id for s in spans for _ in s.groups]
    member_groups = [g for s in spans for g in sorted(s.groups)]
    params: list[list[int] | list[float] | list[str]] = [
        [s.job_id for s in spans],
        [s.lo for s in spans],
        [s.hi for s in spans],
        member_jobs,
        member_groups,
    ]
    with connection.cursor() as cursor:
        cursor.execute(_SQL, params)
        rows = cursor.fetchall()
    return {row[0]: _sums(*row[1:]) for row in rows}


def _sums(
    in_flight: float | None,
    trainer: float | None,
    sandman: float | None,
    consumed: int | None,
    member_seconds: float | None,
    lost: float | None,
    member_acquisition: float | None,
) -> JobSums:
    return JobSums(
        in_flight_seconds=float(in_flight or 0.0),
        acquisition_seconds=float(trainer or 0.0) + float(sandman or 0.0),
        consumed=int(consumed or 0),
        member_seconds=float(member_seconds or 0.0),
        lost_seconds=float(lost or 0.0),
        member_acquisition_seconds=float(member_acquisition or 0.0),
    )
