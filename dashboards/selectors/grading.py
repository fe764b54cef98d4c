"""Reads behind the grading page (``/gradings/``): one aggregate query per table.

Rules a reader must not break (as in ``selectors.overview``): aggregate in the database,
Python only converts the one row per group it gets back; no N+1; time is a parameter (the
:class:`~dashboards.filters.ChartFilter`: its window, jobs and backend narrow every query
in SQL; the per-job table is its top N jobs plus "others").

Definitions (shown on the page too):

* *Gradings per minute by verdict*: gradings whose ``finished_at`` falls in the bucket.
* *Probe refusals*: gradings of the bucket with at least one attempt refused by the
  ``/probe`` check (found in the stored attempts' text, portable across databases); the
  rate divides by the bucket's gradings, as the ``no_verdict`` rate does.
* *Acquisition p50/p99 by source*: successful acquisitions of role ``grading`` finished in
  the window; source ``created`` is shown as ``fresh``.
* *Creates per grading*: grading sandboxes requested in the window over gradings decided
  in it, per job.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db.models import Count, F, Q, QuerySet, TextField
from django.db.models.functions import Cast

from dashboards.filters import OTHERS, ChartFilter, top_with_others
from dashboards.rows.grading import JobCreates, SourceLatency, VerdictBucket
from dashboards.sql import epoch_bucket, grouped_percentiles
from dashboards.window import bucket_start
from grading.models import Grading
from grading.states import GradingState, VerdictChoice
from sandboxes.models import Acquisition, Job, Sandbox
from sandboxes.states import AcquisitionOutcome, Role, SandboxSource

SOURCE_NAMES = {SandboxSource.CREATED: "fresh", SandboxSource.WARM: "warm"}
SOURCE_NAMES[SandboxSource.REUSED] = "reused"
PROBE_REFUSED = '"probe_refused"'


def _done_in(flt: ChartFilter) -> QuerySet[Grading]:
    window = flt.window
    return flt.job_rows(
        Grading.objects.order_by().filter(
            state=GradingState.DONE, finished_at__gte=window.since, finished_at__lt=window.until
        )
    )


def verdicts_per_bucket(flt: ChartFilter) -> list[VerdictBucket]:
    """Gradings decided per bucket, by verdict, and those with a probe refusal; one query."""
    window = flt.window
    rows = (
        _done_in(flt)
        .annotate(
            g_bucket=epoch_bucket("finished_at", window.bucket_s),
            g_attempts=Cast("attempts", TextField()),
        )
        .values("g_bucket")
        .annotate(
            resolved=Count("pk", filter=Q(verdict=VerdictChoice.RESOLVED)),
            unresolved=Count("pk", filter=Q(verdict=VerdictChoice.UNRESOLVED)),
            no_verdict=Count("pk", filter=Q(verdict=VerdictChoice.NO_VERDICT)),
            probe_refused=Count("pk", filter=Q(g_attempts__contains=PROBE_REFUSED)),
        )
        .order_by("g_bucket")
    )
    return [
        VerdictBucket(
            bucket_start=bucket_start(row["g_bucket"], window.bucket_s),
            bucket_s=int(window.bucket_s),
            resolved=row["resolved"],
            unresolved=row["unresolved"],
            no_verdict=row["no_verdict"],
            probe_refused=row["probe_refused"],
        )
        for row in rows
    ]


def acquisition_by_source(flt: ChartFilter) -> list[SourceLatency]:
    """Grading acquisitions' wait p50/p99 per source; one query."""
    window = flt.window
    finished = flt.acquisitions(
        Acquisition.objects.filter(
            role=Role.GRADING,
            outcome=AcquisitionOutcome.OK,
            finished_at__gte=window.since,
            finished_at__lt=window.until,
        )
    )
    groups = grouped_percentiles(
        finished, group=F("source"), value=F("wait_ms"), fractions=(0.5, 0.99)
    )
    by_source = {g.group: g for g in groups}
    rows = []
    for source, name in SOURCE_NAMES.items():
        g = by_source.get(source)
        rows.append(
            SourceLatency(
                source=name,
                n=g.n if g else 0,
                p50_ms=g.values[0] if g else None,
                p99_ms=g.values[1] if g else None,
            )
        )
    return rows


def _merge_creates(rows: Sequence[JobCreates]) -> JobCreates:
    return JobCreates(
        job_id=None,
        job_name=f"{OTHERS} ({len(rows)} jobs)",
        creates=sum(r.creates for r in rows),
        gradings=sum(r.gradings for r in rows),
    )


def creates_per_grading(flt: ChartFilter) -> list[JobCreates]:
    """Per job with gradings or grading creates in the window (the filter's top N by
    gradings plus creates, the rest as "others"); three grouped queries."""
    window = flt.window
    creates = dict(
        flt.sandboxes(Sandbox.objects.order_by())
        .filter(role=Role.GRADING, requested_at__gte=window.since, requested_at__lt=window.until)
        .values("job_id")
        .annotate(n=Count("pk"))
        .values_list("job_id", "n")
    )
    gradings = dict(
        _done_in(flt).values("job_id").annotate(n=Count("pk")).values_list("job_id", "n")
    )
    ids = sorted(set(creates) | set(gradings))
    names = dict(Job.objects.filter(pk__in=ids).values_list("pk", "name"))
    per_job = [
        JobCreates(
            job_id=job_id,
            job_name=names.get(job_id, ""),
            creates=creates.get(job_id, 0),
            gradings=gradings.get(job_id, 0),
        )
        for job_id in ids
    ]
    return top_with_others(
        per_job, top=flt.top, volume=lambda r: r.creates + r.gradings, merge=_merge_creates
    )
