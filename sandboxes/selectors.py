"""Reads of jobs and sandboxes for the REST API, the client and /metrics.

Invariants a reader must not break:
* Ownership is decided HERE, once: a non-staff user sees only the jobs they own and the
  sandboxes of those jobs. Anything else is ``NotFound`` (404), never ``PermissionDenied``,
  so an id's existence never leaks. Staff see everything.
* No side effects; counts and histograms are aggregated in the database (one query each),
  never by looping over rows in Python.
* Tokens are never selected for listing: list/detail querysets ``defer("token")``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import (
    Count,
    DurationField,
    ExpressionWrapper,
    F,
    JSONField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)

from sandboxes.models import (
    Acquisition,
    AddressFloorChange,
    IdempotentCall,
    Job,
    Sandbox,
    SandboxEvent,
    SubnetSample,
)
from sandboxes.services.rawinsert import quoted_column
from sandboxes.states import AcquisitionOutcome, SandboxState
from sandman_site.errors import NotFound

# States that count as "live" for a job's live count: holding (or about to hold) a
# backend resource and not yet on the way out.
_LIVE_STATES = (
    SandboxState.REQUESTED,
    SandboxState.CREATING,
    SandboxState.READY,
    SandboxState.IN_USE,
    SandboxState.RELEASED,
)
_CREATING_STATES = (SandboxState.REQUESTED, SandboxState.CREATING)


@dataclass(frozen=True)
class JobCounts:
    live: int
    warm: int
    creating: int


def _is_staff(user: Any) -> bool:
    return bool(getattr(user, "is_staff", False))


def job_list_for_user(*, user: Any) -> QuerySet[Job]:
    """The caller's jobs, newest first (every job for staff)."""
    qs = Job.objects.all()
    if not _is_staff(user):
        qs = qs.filter(owner_id=user.pk)
    return qs.order_by("-created_at", "-id")


def job_get_for_user(*, user: Any, job_id: int) -> Job:
    """The job if the caller may see it; ``NotFound`` otherwise (also for others' jobs)."""
    try:
        return job_list_for_user(user=user).get(pk=job_id)
    except Job.DoesNotExist as exc:
        raise NotFound(f"No job {job_id}.") from exc


def job_owner_id(*, job_id: int) -> int | None:
    """The job's owner's id, or None when there is no such job: the read behind
    ``sandboxes.apis.access``'s job map, which applies :func:`job_list_for_user`'s rule
    (staff see every job, anyone else their own) to it."""
    return Job.objects.filter(pk=job_id).values_list("owner_id", flat=True).first()


def job_counts(*, job_id: int) -> JobCounts:
    """Live, warm (ready and not handed out) and creating sandboxes of one job, one query."""
    agg = Sandbox.objects.filter(job_id=job_id).aggregate(
        live=Count("id", filter=Q(state__in=_LIVE_STATES)),
        warm=Count("id", filter=Q(state=SandboxState.READY)),
        creating=Count("id", filter=Q(state__in=_CREATING_STATES)),
    )
    return JobCounts(live=agg["live"], warm=agg["warm"], creating=agg["creating"])


def job_counts_many(*, job_ids: Sequence[int]) -> dict[int, JobCounts]:
    """``job_counts`` for a page of jobs in one grouped query (no N+1 in the list view)."""
    rows = (
        Sandbox.objects.filter(job_id__in=list(job_ids))
        .values("job_id")
        .annotate(
            live=Count("id", filter=Q(state__in=_LIVE_STATES)),
            warm=Count("id", filter=Q(state=SandboxState.READY)),
            creating=Count("id", filter=Q(state__in=_CREATING_STATES)),
        )
    )
    counts = {jid: JobCounts(0, 0, 0) for jid in job_ids}
    for row in rows:
        counts[row["job_id"]] = JobCounts(row["live"], row["warm"], row["creating"])
    return counts


def sandbox_list_for_user(
    *,
    user: Any,
    job_id: int | None = None,
    state: str | None = None,
    role: str | None = None,
) -> QuerySet[Sandbox]:
    """Sandboxes the caller may see, newest first, filtered; the token is never loaded."""
    qs = Sandbox.objects.defer("token")
    if not _is_staff(user):
        qs = qs.filter(job__owner_id=user.pk)
    if job_id is not None:
        qs = qs.filter(job_id=job_id)
    if state:
        qs = qs.filter(state=state)
    if role:
        qs = qs.filter(role=role)
    return qs.order_by("-requested_at", "-id")


def sandbox_get_for_user(*, user: Any, sandbox_id: int) -> Sandbox:
    """One sandbox (token deferred) if the caller may see it; ``NotFound`` otherwise."""
    try:
        return sandbox_list_for_user(user=user).get(pk=sandbox_id)
    except Sandbox.DoesNotExist as exc:
        raise NotFound(f"No sandbox {sandbox_id}.") from exc


def sandbox_events(*, sandbox_id: int) -> QuerySet[SandboxEvent]:
    """A sandbox's timeline, oldest first."""
    return SandboxEvent.objects.filter(sandbox_id=sandbox_id).order_by("at", "id")


# --- aggregates for /metrics -------------------------------------------------------------


def sandbox_create_total() -> int:
    """Every create ever requested (one Sandbox row per create)."""
    return Sandbox.objects.count()


def sandbox_state_counts() -> dict[str, int]:
    rows = Sandbox.objects.values("state").annotate(n=Count("id")).order_by()
    return {row["state"]: row["n"] for row in rows}


def acquisition_counts() -> list[tuple[str, str, int]]:
    """``(source, outcome, count)`` for every pair seen among FINISHED acquisitions (an open
    ``pending`` row would make a Prometheus counter go down when it finishes)."""
    rows = (
        Acquisition.objects.exclude(outcome=AcquisitionOutcome.PENDING)
        .values("source", "outcome")
        .annotate(n=Count("id"))
        .order_by("source", "outcome")
    )
    return [(row["source"], row["outcome"], row["n"]) for row in rows]


@dataclass(frozen=True)
class Histogram:
    """Cumulative counts per upper bound (seconds), plus total count and sum."""

    buckets: tuple[tuple[float, int], ...]
    count: int
    sum_s: float


def create_to_ready_histogram(*, bounds_s: Sequence[float]) -> Histogram:
    """Create-to-Ready (``requested_at`` → ``ready_at``) of every sandbox that got Ready.

    One aggregate query: one conditional count per bucket bound, a count and a sum.
    Portable: Django turns the datetime difference into an interval on PostgreSQL and
    into microseconds on SQLite.
    """
    duration = ExpressionWrapper(F("ready_at") - F("requested_at"), output_field=DurationField())
    qs = Sandbox.objects.filter(ready_at__isnull=False).annotate(c2r=duration)
    aggregates: dict[str, Any] = {
        f"le_{i}": Count("id", filter=Q(c2r__lte=dt.timedelta(seconds=bound)))
        for i, bound in enumerate(bounds_s)
    }
    aggregates["n"] = Count("id")
    aggregates["total"] = Sum("c2r")
    agg = qs.aggregate(**aggregates)
    total = agg["total"]
    if total is None:
        sum_s = 0.0
    elif isinstance(total, dt.timedelta):
        sum_s = total.total_seconds()
    else:  # a backend that hands back microseconds
        sum_s = float(total) / 1e6
    return Histogram(
        buckets=tuple((bound, agg[f"le_{i}"]) for i, bound in enumerate(bounds_s)),
        count=agg["n"],
        sum_s=sum_s,
    )


def idempotent_answer(*, route: str, scope: int, key: str) -> dict[str, Any] | None:
    """The recorded answer of an earlier call with this ``Idempotency-Key``, or None.

    A recorded acquire gets its token back from the sandbox row (records never hold one).
    ONE raw statement (the token joined): every keyed acquire and release reads this first,
    on a web worker's request thread, and the ORM's compile of the two reads cost ~4x
    their execution (~590 us of CPU against ~140 for the raw read, PostgreSQL)."""
    call, box = IdempotentCall._meta, Sandbox._meta
    qn = connection.ops.quote_name

    def col(name: str) -> str:
        return quoted_column(IdempotentCall, name)

    sql = (
        f"SELECT c.{col('answer')}, c.{col('sandbox_id')}, s.{quoted_column(Sandbox, 'token')} "
        f"FROM {qn(call.db_table)} c LEFT JOIN {qn(box.db_table)} s "
        f"ON s.{qn(box.pk.column)} = c.{col('sandbox_id')} "
        f"WHERE c.{col('route')} = %s AND c.{col('scope')} = %s AND c.{col('key')} = %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [route, scope, key])
        found = cursor.fetchone()  # at most one: (route, scope, key) is unique
    if found is None:
        return None
    stored, sandbox_id, token = found
    field = call.get_field("answer")
    assert isinstance(field, JSONField)
    answer = dict(field.from_db_value(stored, field.get_col(call.db_table), connection) or {})
    if route == "acquire" and sandbox_id is not None:
        answer["token"] = token or ""
    return answer


# --- free pod addresses (sandboxes.addresses) -------------------------------------------


def latest_subnet_samples() -> list[SubnetSample]:
    """The latest reading of every subnet (one query; a subnet's newest row wins)."""
    newest = SubnetSample.objects.filter(subnet_id=OuterRef("subnet_id")).order_by("-at", "-id")
    return list(
        SubnetSample.objects.filter(pk=Subquery(newest.values("pk")[:1])).order_by("subnet_id")
    )


def address_floor_closed() -> bool:
    """True while the latest floor change closed the gate (no create for lack of addresses)."""
    last = AddressFloorChange.objects.order_by("-at", "-id").values_list("closed", flat=True)[:1]
    return bool(last and last[0])
