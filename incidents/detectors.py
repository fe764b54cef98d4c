"""Detectors: read recorded sandbox events and acquisitions, open draft incidents.

The controller calls ``run_all(now=...)`` periodically (it is synchronous ORM code: call
it from a thread or ``sync_to_async``). Each detector aggregates per UTC minute in the
database over the look-back window ``SANDMAN_DETECT_LOOKBACK_S``, flags minutes over its
threshold (``SANDMAN_DETECT_*`` settings), joins them into bursts
(``incidents.windows``) and then, for each burst:

* if an incident of the same detector already covers it or ends within the merge gap
  before it, that incident is widened (end, per-minute detail, links) — nothing opens;
* otherwise a draft opens with window = the burst's first minute. The database refuses a
  second ``(detector_key, detector_window)`` (``incident_detector_window_once``).

So re-running over the same events never opens the same case twice, and a long outage
seen across many runs stays one case. ``run_all`` returns only incidents it opened.
The pod-cap detector opens at most one case per job (window ``job:<id>``). Ownerless pods
come from the sweep through ``incidents.services.ownerless_pods_found``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Count, Max, Min, Q, QuerySet
from django.db.models.functions import Coalesce, TruncMinute

from incidents import addressfloor, services, windows
from incidents.models import Incident
from incidents.services import Draft
from incidents.states import Stage
from incidents.windows import Burst, MinuteCount
from sandboxes import events
from sandboxes.models import Acquisition, Sandbox, SandboxEvent
from sandboxes.states import AcquisitionOutcome

CREATE_ERRORS = "create_5xx_burst"
ADDRESS_FAILURES = "address_failure_burst"
ACQUIRE_TIMEOUTS = "acquire_timeout_burst"
POD_CAP = "pod_cap"
_FMT = "%Y-%m-%d %H:%M"


@dataclass(frozen=True)
class _Spec:
    """How one burst detector names and describes what it found."""

    key: str
    stage: str
    title: str  # format fields: share, start, minutes
    describe: Callable[[Burst, dict[str, Any]], tuple[str, str]]  # -> what happened, effect
    how_found: str


def run_all(*, now: datetime) -> list[Incident]:
    """Run every detector over the look-back window ending at ``now``; return new drafts."""
    since = now - timedelta(seconds=settings.SANDMAN_DETECT_LOOKBACK_S)
    opened: list[Incident] = []
    opened += detect_create_errors(since=since, now=now)
    opened += detect_address_failures(since=since, now=now)
    opened += detect_acquire_timeouts(since=since, now=now)
    opened += detect_pod_cap(since=since, now=now)
    opened += addressfloor.detect_address_floor(since=since, now=now)
    return opened


# --- the burst detectors --------------------------------------------------------------


def _minute_rows(qs: QuerySet, *, time_field: str, hits: Any, total: Any) -> list[MinuteCount]:
    rows = (
        qs.annotate(minute=TruncMinute(time_field))
        .values("minute")
        .annotate(hits=hits, total=total)
        .order_by("minute")
    )
    return [MinuteCount(minute=r["minute"], hits=r["hits"], total=r["total"]) for r in rows]


def detect_create_errors(*, since: datetime, now: datetime) -> list[Incident]:
    """Share of pod creates answered 5xx in a minute (CREATE_ERROR status >= 500 over the
    distinct sandboxes with CREATE_SENT or CREATE_ERROR in that minute)."""
    return _detect_event_share(
        _CREATE_SPEC,
        bad=Q(kind=events.CREATE_ERROR, detail__status__gte=500),
        kinds=[events.CREATE_SENT, events.CREATE_ERROR],
        share=settings.SANDMAN_DETECT_CREATE_ERROR_SHARE,
        min_hits=settings.SANDMAN_DETECT_CREATE_ERROR_MIN,
        since=since,
        now=now,
    )


def detect_address_failures(*, since: datetime, now: datetime) -> list[Incident]:
    """Share of sandboxes scheduled in a minute that hit an address-assignment failure
    (distinct sandboxes with ADDRESS_FAILURE over those with SCHEDULED or ADDRESS_FAILURE)."""
    return _detect_event_share(
        _ADDRESS_SPEC,
        bad=Q(kind=events.ADDRESS_FAILURE),
        kinds=[events.SCHEDULED, events.ADDRESS_FAILURE],
        share=settings.SANDMAN_DETECT_ADDRESS_FAILURE_SHARE,
        min_hits=settings.SANDMAN_DETECT_ADDRESS_FAILURE_MIN,
        since=since,
        now=now,
    )


def _detect_event_share(
    spec: _Spec,
    *,
    bad: Q,
    kinds: list[str],
    share: float,
    min_hits: int,
    since: datetime,
    now: datetime,
) -> list[Incident]:
    """Per minute, the distinct sandboxes with a ``bad`` event over those with any event of
    ``kinds``; minutes reaching ``share`` with at least ``min_hits`` are settled as ``spec``."""
    qs = SandboxEvent.objects.filter(at__gte=since, at__lte=now, kind__in=kinds)
    rows = _minute_rows(
        qs,
        time_field="at",
        hits=Count("sandbox", filter=bad, distinct=True),
        total=Count("sandbox", distinct=True),
    )
    flagged = windows.over_share(rows, share=share, min_hits=min_hits)

    def involved(burst: Burst) -> QuerySet:
        return SandboxEvent.objects.filter(bad, at__gte=burst.start, at__lt=burst.end)

    return _settle(spec, flagged, involved, now=now)


def _ended_acquisitions(outcome: str) -> QuerySet:
    """Acquisitions with ``outcome``, annotated ``ended`` (finish time, else start time)."""
    return Acquisition.objects.filter(outcome=outcome).annotate(
        ended=Coalesce("finished_at", "started_at")
    )


def detect_acquire_timeouts(*, since: datetime, now: datetime) -> list[Incident]:
    """Acquisitions that ended in ``timeout`` per minute (by finish, else start time)."""
    qs = _ended_acquisitions(AcquisitionOutcome.TIMEOUT).filter(ended__gte=since, ended__lte=now)
    rows = _minute_rows(qs, time_field="ended", hits=Count("id"), total=Count("id"))
    flagged = windows.over_count(rows, min_hits=settings.SANDMAN_DETECT_ACQUIRE_TIMEOUTS_MIN)

    def involved(burst: Burst) -> QuerySet:
        return _ended_acquisitions(AcquisitionOutcome.TIMEOUT).filter(
            ended__gte=burst.start, ended__lt=burst.end
        )

    return _settle(_TIMEOUT_SPEC, flagged, involved, now=now)


def _settle(
    spec: _Spec,
    flagged: list[MinuteCount],
    involved: Callable[[Burst], QuerySet],
    *,
    now: datetime,
) -> list[Incident]:
    gap = timedelta(seconds=settings.SANDMAN_DETECT_MERGE_GAP_S)
    opened: list[Incident] = []
    for burst in windows.group_bursts(flagged, merge_gap=gap):
        job_ids, sandbox_ids, summary = _links(involved(burst))
        existing = (
            Incident.objects.filter(
                detector_key=spec.key,
                started_at__lte=burst.end,
                ended_at__gte=burst.start - gap,
            )
            .order_by("started_at", "id")
            .first()
        )
        if existing is not None:
            detail = _merge_detail(existing.detector_detail, burst, summary)
            services.detector_incident_extend(
                incident_id=existing.pk,
                ended_at=burst.end,
                detail=detail,
                job_ids=job_ids,
                sandbox_ids=_capped(existing, sandbox_ids),
            )
            continue
        detail = _merge_detail({}, burst, summary)
        what, effect = spec.describe(burst, summary)
        draft = Draft(
            key=spec.key,
            window=windows.minute_key(burst.start),
            title=spec.title.format(
                share=burst.hits / burst.total if burst.total else 0,
                hits=burst.hits,
                start=burst.start.strftime(_FMT),
                minutes=len(burst.minutes),
            ),
            stage=spec.stage,
            what_happened=what,
            how_found=spec.how_found,
            effect=effect,
            started_at=burst.start,
            ended_at=burst.end,
            detail=detail,
        )
        incident = services.detector_incident_open(
            draft=draft, job_ids=job_ids, sandbox_ids=sandbox_ids, now=now
        )
        if incident is not None:
            opened.append(incident)
    return opened


def _links(qs: QuerySet) -> tuple[list[int], list[int], dict[str, Any]]:
    """Jobs and (capped) sandboxes involved, plus a summary for the record."""
    model = qs.model
    sandbox_field = "sandbox" if model in (SandboxEvent, Acquisition) else "pk"
    job_field = "sandbox__job" if model is SandboxEvent else "job"
    cap = settings.SANDMAN_DETECT_MAX_LINKED_SANDBOXES
    sandbox_ids = list(
        qs.exclude(**{f"{sandbox_field}__isnull": True})
        .values_list(sandbox_field, flat=True)
        .order_by(sandbox_field)
        .distinct()[:cap]
    )
    job_ids = list(qs.values_list(job_field, flat=True).order_by(job_field).distinct())
    summary: dict[str, Any] = {"jobs": len(job_ids)}
    if model is SandboxEvent:
        statuses = qs.values("detail__status").annotate(n=Count("id")).order_by("-n")[:5]
        summary["statuses"] = {str(r["detail__status"]): r["n"] for r in statuses}
        messages = qs.values("detail__error").annotate(n=Count("id")).order_by("-n")[:3]
        summary["errors"] = [
            [str(r["detail__error"] or "")[:200], r["n"]] for r in messages if r["detail__error"]
        ]
        nodes = qs.values("detail__node").annotate(n=Count("id")).order_by("-n")[:5]
        summary["nodes"] = {str(r["detail__node"]): r["n"] for r in nodes if r["detail__node"]}
    return [j for j in job_ids if j is not None], sandbox_ids, summary


def _capped(incident: Incident, sandbox_ids: Sequence[int]) -> list[int]:
    room = settings.SANDMAN_DETECT_MAX_LINKED_SANDBOXES - incident.sandboxes.count()
    return list(sandbox_ids[: max(room, 0)])


def _merge_detail(old: dict[str, Any], burst: Burst, summary: dict[str, Any]) -> dict[str, Any]:
    """Per-minute counts keyed by minute, so re-runs overwrite rather than add up."""
    minutes = dict(old.get("minutes", {}))
    for m in burst.minutes:
        minutes[windows.minute_key(m.minute)] = [m.hits, m.total]
    hits = sum(v[0] for v in minutes.values())
    total = sum(v[1] for v in minutes.values())
    return {**summary, "minutes": minutes, "hits": hits, "total": total}


def _describe_create(burst: Burst, summary: dict[str, Any]) -> tuple[str, str]:
    statuses = ", ".join(f"{k}×{v}" for k, v in summary.get("statuses", {}).items())
    errors = "; ".join(f"“{msg}” ×{n}" for msg, n in summary.get("errors", []))
    what = (
        f"From {burst.start:%H:%M} to {burst.end:%H:%M} UTC ({len(burst.minutes)} flagged "
        f"minute(s)), {burst.hits} of {burst.total} pod creates ({burst.hits / burst.total:.0%}) "
        f"were answered with HTTP 5xx (statuses {statuses})."
        + (f" Most common errors: {errors}." if errors else "")
    )
    effect = f"{burst.hits} failed creates (HTTP 5xx) across {summary['jobs']} job(s)."
    return what, effect


def _describe_address(burst: Burst, summary: dict[str, Any]) -> tuple[str, str]:
    nodes = ", ".join(f"{k} ({v})" for k, v in summary.get("nodes", {}).items())
    what = (
        f"From {burst.start:%H:%M} to {burst.end:%H:%M} UTC, {burst.hits} of {burst.total} "
        f"scheduled sandboxes ({burst.hits / burst.total:.0%}) waited on pod-address "
        f"assignment failures." + (f" Busiest nodes: {nodes}." if nodes else "")
    )
    effect = f"{burst.hits} sandboxes delayed by address-assignment retries."
    return what, effect


def _describe_timeouts(burst: Burst, summary: dict[str, Any]) -> tuple[str, str]:
    what = (
        f"From {burst.start:%H:%M} to {burst.end:%H:%M} UTC, {burst.hits} acquisitions "
        f"ran out of time across {summary['jobs']} job(s)."
    )
    effect = f"{burst.hits} acquire timeouts (workers without a sandbox)."
    return what, effect


_CREATE_SPEC = _Spec(
    key=CREATE_ERRORS,
    stage=Stage.SERVICE_ADMISSION,
    title="Pod creates answered 5xx ({share:.0%}) from {start} UTC",
    describe=_describe_create,
    how_found="Detector create_5xx_burst over recorded create events.",
)
_ADDRESS_SPEC = _Spec(
    key=ADDRESS_FAILURES,
    stage=Stage.SERVICE_ADMISSION,
    title="Pod-address assignment failures ({share:.0%}) from {start} UTC",
    describe=_describe_address,
    how_found="Detector address_failure_burst over recorded scheduling events.",
)
_TIMEOUT_SPEC = _Spec(
    key=ACQUIRE_TIMEOUTS,
    stage=Stage.CREATION,
    title="Burst of {hits} acquire timeouts from {start} UTC",
    describe=_describe_timeouts,
    how_found="Detector acquire_timeout_burst over recorded acquisitions.",
)


# --- pod cap ----------------------------------------------------------------------------


def detect_pod_cap(*, since: datetime, now: datetime) -> list[Incident]:
    """A job that hit its pod cap (POD_CAP events or acquisitions refused with ``cap``):
    one draft per job, ever."""
    per_job: dict[int, dict[str, Any]] = {}
    cap_events = (
        SandboxEvent.objects.filter(kind=events.POD_CAP, at__gte=since, at__lte=now)
        .values("sandbox__job")
        .annotate(n=Count("id"), first=Min("at"), last=Max("at"))
        .order_by()
    )
    for row in cap_events:
        _fold(per_job, row["sandbox__job"], row, "events")
    refused = (
        _ended_acquisitions(AcquisitionOutcome.CAP)
        .filter(ended__gte=since, ended__lte=now)
        .values("job")
        .annotate(n=Count("id"), first=Min("ended"), last=Max("ended"))
        .order_by()
    )
    for row in refused:
        _fold(per_job, row["job"], row, "refused_acquisitions")
    threshold = settings.SANDMAN_DETECT_POD_CAP_MIN
    opened: list[Incident] = []
    for job_id, seen in sorted(per_job.items()):
        if seen["events"] + seen["refused_acquisitions"] < threshold:
            continue
        window = f"job:{job_id}"
        if Incident.objects.filter(detector_key=POD_CAP, detector_window=window).exists():
            continue
        sandbox_ids = list(
            SandboxEvent.objects.filter(kind=events.POD_CAP, sandbox__job=job_id)
            .values_list("sandbox", flat=True)
            .order_by("sandbox")
            .distinct()[: settings.SANDMAN_DETECT_MAX_LINKED_SANDBOXES]
        )
        live = Sandbox.objects.filter(job=job_id, deleted_at__isnull=True).count()
        draft = Draft(
            key=POD_CAP,
            window=window,
            title=f"Job {job_id} reached its pod cap",
            stage=Stage.CLEANUP,
            what_happened=(
                f"Job {job_id} ran into its pod cap from {seen['first']:%Y-%m-%d %H:%M} UTC: "
                f"{seen['events']} pod-cap event(s) and {seen['refused_acquisitions']} "
                f"acquisition(s) refused at the cap; {live} of its sandboxes not deleted."
            ),
            how_found="Detector pod_cap over recorded events and acquisitions.",
            effect=f"{seen['refused_acquisitions']} acquisitions refused at the cap.",
            started_at=seen["first"],
            ended_at=seen["last"],
            detail={**seen, "first": seen["first"].isoformat(), "last": seen["last"].isoformat()},
        )
        incident = services.detector_incident_open(
            draft=draft, job_ids=[job_id], sandbox_ids=sandbox_ids, now=now
        )
        if incident is not None:
            opened.append(incident)
    return opened


def _fold(per_job: dict[int, dict[str, Any]], job_id: int, row: dict[str, Any], kind: str) -> None:
    seen = per_job.setdefault(
        job_id, {"events": 0, "refused_acquisitions": 0, "first": row["first"], "last": row["last"]}
    )
    seen[kind] += row["n"]
    seen["first"] = min(seen["first"], row["first"])
    seen["last"] = max(seen["last"], row["last"])
