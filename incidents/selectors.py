"""Reads of incident records: filtered lists, the export set, and the GPU-hour accounting.

The accounting (Table A49) is aggregated in the database. Its one counting rule: each
job's loss is counted in one case only. An incident with a GPU-hour account that links a
job also linked to an EARLIER-recorded incident with an account (order: ``recorded_at``,
then ``id``) is flagged ``overlaps_with`` that earlier incident and left out of every
sum. The earlier incident counts whether or not it is itself flagged, so the rule is
one subquery, deterministic, and can only under-count, never double-count. The sandbox
path and cluster events outside it (stage ``outside``) are summed apart, as the paper does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.db.models import (
    Case,
    Count,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)

from incidents import rules
from incidents.models import TEXT_FIELDS, Incident
from incidents.states import Stage

ACCOUNT = Q(gpu_hours_basis__in=rules.ACCOUNT_BASES)
CAUSE_FLAGS = ("cause_in_implementation", "cause_in_kubernetes_default", "cause_in_cluster_service")


def incident_list(*, filters: dict[str, Any] | None = None) -> QuerySet[Incident]:
    """Incidents, newest first, with links prefetched; ``filters`` from the API's query."""
    filters = filters or {}
    qs = Incident.objects.select_related("recorded_by").prefetch_related("jobs", "sandboxes")
    for name in ("status", "stage", "evidence_kind", "gpu_hours_basis", "detector_key"):
        if filters.get(name):
            qs = qs.filter(**{name: filters[name]})
    if filters.get("cause"):
        qs = qs.filter(cause_class_q(filters["cause"]))
    if filters.get("has_account") is not None:
        qs = qs.filter(ACCOUNT) if filters["has_account"] else qs.exclude(ACCOUNT)
    if filters.get("job"):
        qs = qs.filter(jobs=filters["job"])
    if filters.get("q"):
        qs = qs.filter(text_search_q(filters["q"]))
    return qs.order_by("-started_at", "-id")


def incident_get(*, incident_id: int) -> Incident:
    return incident_list().get(pk=incident_id)


def cause_class_q(key: str) -> Q:
    """Exactly the class ``key`` (e.g. ``implementation+kubernetes_default``), or, with a
    ``has:`` prefix, any class that includes that part (``has:implementation``)."""
    parts = {
        "implementation": "cause_in_implementation",
        "kubernetes_default": "cause_in_kubernetes_default",
        "cluster_service": "cause_in_cluster_service",
    }
    if key.startswith("has:"):
        return Q(**{parts[key[4:]]: True})
    wanted = set() if key == "not_established" else set(key.split("+"))
    return Q(**{flag: (name in wanted) for name, flag in parts.items()})


def cause_class_keys() -> list[str]:
    return list(rules.CLASS_ORDER)


def text_search_q(term: str) -> Q:
    query = Q()
    for name in TEXT_FIELDS:
        query |= Q(**{f"{name}__icontains": term})
    return query


def with_overlap(qs: QuerySet[Incident]) -> QuerySet[Any]:
    """Annotate ``overlaps_with``: the earliest earlier-recorded incident with a GPU-hour
    account that shares a job with this one (null when none, or without an account)."""
    earlier = (
        Incident.objects.filter(ACCOUNT, jobs__incidents=OuterRef("pk"))
        .filter(
            Q(recorded_at__lt=OuterRef("recorded_at"))
            | Q(recorded_at=OuterRef("recorded_at"), pk__lt=OuterRef("pk"))
        )
        .order_by("recorded_at", "pk")
        .values("pk")[:1]
    )
    return qs.annotate(overlaps_with=Case(When(ACCOUNT, then=Subquery(earlier)), default=None))


# --- accounting ---------------------------------------------------------------------


@dataclass(frozen=True)
class Bounds:
    low: Decimal
    high: Decimal
    cases: int


@dataclass(frozen=True)
class ClassRow:
    path: str  # "sandbox" | "outside"
    key: str
    label: str
    bounds: Bounds


@dataclass(frozen=True)
class WorkloadRow:
    path: str
    workload: str
    bounds: Bounds


@dataclass(frozen=True)
class Accounting:
    by_class: list[ClassRow]
    by_workload: list[WorkloadRow]
    totals: dict[str, Bounds]  # "sandbox", "outside", "all"
    # Incidents annotated with ``overlaps_with`` and ``path`` (flagged ones included).
    cases: list[Any] = field(default_factory=list)


def _path_expr() -> Case:
    return Case(
        When(stage=Stage.OUTSIDE, then=Value("outside")),
        default=Value("sandbox"),
    )


def _bounds(row: dict[str, Any]) -> Bounds:
    return Bounds(low=row["low"] or Decimal(0), high=row["high"] or Decimal(0), cases=row["cases"])


def accounting() -> Accounting:
    """Table A49: GPU-hour bounds by root-cause class and by workload, per path."""
    accounted = with_overlap(Incident.objects.filter(ACCOUNT)).annotate(path=_path_expr())
    counted = accounted.filter(overlaps_with__isnull=True)
    sums = {"low": Sum("gpu_hours_low"), "high": Sum("gpu_hours_high"), "cases": Count("id")}

    class_rows = []
    for row in counted.values("path", *CAUSE_FLAGS).annotate(**sums).order_by():
        flags = {
            "implementation": row["cause_in_implementation"],
            "kubernetes_default": row["cause_in_kubernetes_default"],
            "cluster_service": row["cause_in_cluster_service"],
        }
        class_rows.append(
            ClassRow(
                path=row["path"],
                key=rules.cause_class_key(**flags),
                label=rules.cause_class_label(**flags),
                bounds=_bounds(row),
            )
        )
    class_rows.sort(key=lambda r: (r.path != "sandbox", rules.class_sort_index(r.key)))

    workload_rows = [
        WorkloadRow(path=row["path"], workload=row["workload"] or "(unnamed)", bounds=_bounds(row))
        for row in counted.values("path", "workload").annotate(**sums).order_by()
    ]
    workload_rows.sort(key=lambda r: (r.path != "sandbox", -r.bounds.high, r.workload))

    totals = {
        row["path"]: _bounds(row) for row in counted.values("path").annotate(**sums).order_by()
    }
    totals.setdefault("sandbox", Bounds(Decimal(0), Decimal(0), 0))
    totals.setdefault("outside", Bounds(Decimal(0), Decimal(0), 0))
    totals["all"] = _bounds(counted.aggregate(**sums))

    cases = list(accounted.order_by("-gpu_hours_high", "recorded_at", "id"))
    cases.sort(key=lambda case: case.path != "sandbox")  # stable: sandbox path first
    return Accounting(by_class=class_rows, by_workload=workload_rows, totals=totals, cases=cases)


def accounting_flagged(acc: Accounting) -> list[Any]:
    return [case for case in acc.cases if case.overlaps_with is not None]


def export_queryset() -> QuerySet[Incident]:
    return (
        Incident.objects.select_related("recorded_by")
        .prefetch_related("jobs", "sandboxes")
        .order_by("recorded_at", "id")
    )
