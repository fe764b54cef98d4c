"""Reads behind the operations page (``/operations/``): one aggregate query per table.

Rules a reader must not break (as in ``selectors.overview``): aggregate in the database,
Python only converts the one row per group it gets back; no N+1; time is a parameter (the
:class:`~dashboards.filters.ChartFilter`'s window and its ``until`` stand for "now"); the
filter's jobs and backend narrow every query in SQL, per-job rows are its top N + "others".

Definitions (shown on the page too):

* *Address failures per minute*: ``Sandbox.address_failures`` summed by the bucket of
  ``scheduled_at`` (``requested_at`` when the sandbox was never scheduled). The bucket is
  the window's (one minute for the hour view); the rate is scaled to per minute.
* *By node load*: there is no record of how many sandboxes a node held at a moment, so the
  load is APPROXIMATED as the number of sandboxes on the same node whose ``requested_at``
  falls in the same bucket of the window (a window function, ``COUNT(*) OVER (PARTITION BY
  node, bucket)``). Sandboxes without a node (never scheduled) are left out. The
  approximation ignores pods that started earlier and were still alive, so it under-states
  the load of long-lived pods; it is a proxy for burst pressure on a node.
* *Warm-hit rate* per (job, key): successful acquisitions finished in the window served by
  a warm or reused sandbox over all successful acquisitions of that (job, key).
* *Idle warm pod-hours* per (job, key): for every sandbox that was warm, i.e. Ready and
  either never handed out (``source`` blank) or handed out from the warm pool (``source``
  warm), the time from ``ready_at`` to ``acquired_at`` (else ``deleted_at``, else now),
  clipped to the window, in hours. Computed with database expressions.
* *Incident GPU-hours by root-cause class*: ``incidents.selectors.accounting`` (Table A49),
  all recorded incidents (not windowed), used as it is.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from django.db.models import (
    Count,
    DateTimeField,
    DurationField,
    ExpressionWrapper,
    F,
    Q,
    QuerySet,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, Greatest, Least

from dashboards.filters import OTHERS, ChartFilter, top_with_others
from dashboards.rows.operations import (
    AddressFailureBucket,
    AddressFailureLoad,
    IncidentClassHours,
    WarmKey,
)
from dashboards.selectors import rolled
from dashboards.sql import EpochMs, FloorDiv, raw_rows
from dashboards.window import Window, bucket_start
from incidents import selectors as incident_selectors
from sandboxes.models import Acquisition, Job, Sandbox
from sandboxes.states import AcquisitionOutcome, SandboxSource

HIT_SOURCES = (SandboxSource.WARM, SandboxSource.REUSED)
# A sandbox "was warm" when it became Ready without a caller (blank source) or was then
# handed out from the warm pool.
WARM_SOURCES = ("", SandboxSource.WARM)


def _scheduled_in(flt: ChartFilter) -> QuerySet[Sandbox]:
    window = flt.window
    return (
        flt.sandboxes(Sandbox.objects.order_by())
        .annotate(op_at=Coalesce(F("scheduled_at"), F("requested_at")))
        .filter(op_at__gte=window.since, op_at__lt=window.until)
    )


def address_failures_per_minute(flt: ChartFilter) -> list[AddressFailureBucket]:
    """Address failures per bucket of ``scheduled_at`` (else ``requested_at``); one query."""
    plan = rolled.plan_of(flt)
    if plan is not None:
        return rolled.address_failures_per_minute(flt, plan)
    bucket_s = int(flt.window.bucket_s)
    rows = (
        _scheduled_in(flt)
        .annotate(op_bucket=FloorDiv(EpochMs(F("op_at")), bucket_s * 1000))
        .values("op_bucket")
        .annotate(
            op_n=Count("pk"),
            op_failures=Sum("address_failures"),
            op_unknown=Count("pk", filter=Q(address_failures__isnull=True)),
        )
        .order_by("op_bucket")
        .values_list("op_bucket", "op_n", "op_failures", "op_unknown")
    )
    return [
        AddressFailureBucket(
            bucket_start=bucket_start(bucket, bucket_s),
            bucket_s=bucket_s,
            sandboxes=int(n),
            address_failures=int(failures or 0),
            unknown=int(unknown),
        )
        for bucket, n, failures, unknown in rows
    ]


def address_failures_by_node_load(flt: ChartFilter) -> list[AddressFailureLoad]:
    """Address failures per sandbox, grouped by the (approximate) load of its node.

    Load = sandboxes on the same node requested in the same window bucket (module doc).
    One query: the per-sandbox load is a window function, the outer query groups by it.
    """
    plan = rolled.plan_of(flt)
    if plan is not None:
        return rolled.address_failures_by_node_load(flt, plan)
    window = flt.window
    bucket_s = int(window.bucket_s)
    inner = (
        flt.sandboxes(Sandbox.objects.order_by())
        .filter(requested_at__gte=window.since, requested_at__lt=window.until)
        .exclude(node="")
        .annotate(op_bucket=FloorDiv(EpochMs(F("requested_at")), bucket_s * 1000))
        .values_list("node", "op_bucket", "address_failures")
    )
    inner_sql, params = inner.query.sql_with_params()
    rows = raw_rows(
        "SELECT op_load, COUNT(*), SUM(op_failures),"
        " SUM(CASE WHEN op_failures IS NULL THEN 1 ELSE 0 END) FROM ("
        "SELECT address_failures AS op_failures, "
        "COUNT(*) OVER (PARTITION BY node, op_bucket) AS op_load "
        f"FROM ({inner_sql}) op_src) op_loaded GROUP BY op_load ORDER BY op_load",
        params,
    )
    return [
        AddressFailureLoad(
            node_load=int(load), sandboxes=int(n), address_failures=int(f or 0), unknown=int(u)
        )
        for load, n, f, u in rows
    ]


def _idle(window: Window) -> ExpressionWrapper:
    """``[ready_at, acquired_at | deleted_at | now)`` inside the window, as an interval.

    Summed as an interval and converted once (not per row to milliseconds, which cost ~4x
    the scan of a month's warm sandboxes); microseconds, so no rounding."""
    since = Value(window.since, output_field=DateTimeField())
    until = Value(window.until, output_field=DateTimeField())
    end = Least(Coalesce(F("acquired_at"), F("deleted_at"), until), until)
    return ExpressionWrapper(end - Greatest(F("ready_at"), since), output_field=DurationField())


def _merge_warm_keys(rows: Sequence[WarmKey]) -> WarmKey:
    return WarmKey(
        job_id=None,
        job_name=f"{OTHERS} ({len(rows)} job keys)",
        key_hash="",
        hits=sum(r.hits for r in rows),
        acquisitions=sum(r.acquisitions for r in rows),
        warm_pods=sum(r.warm_pods for r in rows),
        idle_pod_hours=sum(r.idle_pod_hours for r in rows),
    )


def warm_use_by_job_key(flt: ChartFilter) -> list[WarmKey]:
    """Warm-hit rate and idle warm pod-hours per (job, key); two grouped queries.

    The filter's top N (job, key) pairs by acquisitions plus warm pods, the rest as "others".
    """
    window = flt.window
    plan = rolled.plan_of(flt)
    hits = (
        []
        if plan is not None
        else (
            flt.acquisitions(
                Acquisition.objects.filter(
                    outcome=AcquisitionOutcome.OK,
                    finished_at__gte=window.since,
                    finished_at__lt=window.until,
                )
            )
            .order_by()
            .values("job_id", "job__name", "key_hash")
            .annotate(op_hits=Count("pk", filter=Q(source__in=HIT_SOURCES)), op_n=Count("pk"))
        )
    )
    idle = (
        flt.sandboxes(Sandbox.objects.all())
        .filter(
            source__in=WARM_SOURCES,
            ready_at__isnull=False,
            ready_at__lt=window.until,
        )
        .filter(
            Q(acquired_at__isnull=True, deleted_at__isnull=True)
            | Q(acquired_at__gte=window.since)
            | Q(acquired_at__isnull=True, deleted_at__gte=window.since)
        )
        .order_by()
        .annotate(op_idle=_idle(window))
        # Grouped by (job, key) alone and COUNT(*): the partial index sandbox_warm_idle
        # answers it by an index-only scan; job names come from one more small query.
        .values("job_id", "key_hash")
        .annotate(
            op_pods=Count("*"),
            op_idle_sum=Sum("op_idle", filter=Q(op_idle__gt=dt.timedelta(0))),
        )
    )
    merged: dict[tuple[int, str], dict] = {}
    if plan is not None:
        for key, (name, hit_n, n) in rolled.hits_by_key(flt, plan).items():
            merged[key] = {"job_name": name, "hits": hit_n, "acquisitions": n}
    for row in hits:
        merged[(row["job_id"], row["key_hash"])] = {
            "job_name": row["job__name"],
            "hits": row["op_hits"],
            "acquisitions": row["op_n"],
        }
    idle_rows = list(idle)
    names = dict(
        Job.objects.filter(pk__in={r["job_id"] for r in idle_rows}).values_list("pk", "name")
    )
    for row in idle_rows:
        entry = merged.setdefault(
            (row["job_id"], row["key_hash"]), {"job_name": names[row["job_id"]]}
        )
        entry["warm_pods"] = row["op_pods"]
        idle_s = row["op_idle_sum"].total_seconds() if row["op_idle_sum"] else 0.0
        entry["idle_pod_hours"] = idle_s / 3600.0
    per_key = [
        WarmKey(
            job_id=job_id,
            job_name=entry["job_name"],
            key_hash=key_hash,
            hits=entry.get("hits", 0),
            acquisitions=entry.get("acquisitions", 0),
            warm_pods=entry.get("warm_pods", 0),
            idle_pod_hours=entry.get("idle_pod_hours", 0.0),
        )
        for (job_id, key_hash), entry in sorted(merged.items())
    ]
    return top_with_others(
        per_key,
        top=flt.top,
        volume=lambda r: r.acquisitions + r.warm_pods,
        merge=_merge_warm_keys,
    )


def incident_gpu_hours_by_class() -> list[IncidentClassHours]:
    """Table A49's rows by root-cause class, from ``incidents.selectors.accounting``."""
    return [
        IncidentClassHours(
            path=row.path,
            cause_class=row.key,
            label=row.label,
            cases=row.bounds.cases,
            gpu_hours_low=float(row.bounds.low),
            gpu_hours_high=float(row.bounds.high),
        )
        for row in incident_selectors.accounting().by_class
    ]
