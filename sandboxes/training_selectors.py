"""Reads of the trainer's trajectories and learner steps: the critical path and waiting share.

The attribution itself is ``sandboxes.critical_path`` (pure); this module loads exactly the
records it walks through and computes in SQL what is a sum (waiting share, in-flight time).

Invariants a reader must not break:

* A step is in a range when its whole interval ``[wait_start, train_end]`` is inside it; the
  trajectories loaded for those steps are every one that overlaps their span, every member
  of their groups, the last occupant of each slot before the span (so idle slot time is
  ``other``, not ``unresolved``) and the failed predecessors those name, transitively.
  Loading fewer changes the answer; loading more never does.
* No side effects; ownership is checked by the caller (``sandboxes.selectors``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection
from django.db.models import (
    Count,
    ExpressionWrapper,
    F,
    FloatField,
    OuterRef,
    Q,
    QuerySet,
    Subquery,
    Sum,
)
from django.db.models.functions import Greatest, Least

from sandboxes.critical_path import (
    CATEGORIES,
    Attribution,
    FixedConcurrencyEstimate,
    LearnerStep,
    Phase,
    StepAttribution,
    Trajectory,
    attribute_steps,
    combine,
    fixed_concurrency_estimate,
)
from sandboxes.models import LearnerStep as StepRow
from sandboxes.models import StepAttributionRollup, TrajectoryPhase
from sandboxes.models import Trajectory as TrajectoryRow
from sandboxes.training_sums import JobSpan, grouped_sums

_ACQUISITION = ("rollout_acquisition", "grading_acquisition")


@dataclass(frozen=True)
class CriticalPath:
    """The attribution of a job's steps in a range, its waiting share and the estimate."""

    attribution: Attribution
    waiting_share: float | None
    estimate: FixedConcurrencyEstimate | None


def _steps(job_id: int, lo: float | None, hi: float | None) -> list[tuple[int, LearnerStep]]:
    """The job's steps whose whole interval is inside ``[lo, hi]``, with their row ids."""
    rows = StepRow.objects.filter(job_id=job_id)
    if lo is not None:
        rows = rows.filter(wait_start__gte=lo)
    if hi is not None:
        rows = rows.filter(train_end__lte=hi)
    return step_records(rows)


def step_records(rows: QuerySet[StepRow]) -> list[tuple[int, LearnerStep]]:
    """``(row id, step)`` for step rows, by step number."""
    fields = ("pk", "step", "wait_start", "wait_end", "handover_end", "train_end", "groups")
    found = rows.order_by("step").values_list(*fields, "dropped_groups")
    return [
        (
            pk,
            LearnerStep(
                step=step,
                wait_start=wait_start,
                wait_end=wait_end,
                handover_end=handover_end,
                train_end=train_end,
                groups=tuple(groups),
                dropped_groups=tuple(dropped),
            ),
        )
        for pk, step, wait_start, wait_end, handover_end, train_end, groups, dropped in found
    ]


def _trajectory_ids(job_id: int, steps: list[LearnerStep], lo: float, hi: float) -> set[int]:
    groups = {g for s in steps for g in (*s.groups, *s.dropped_groups)}
    job_rows = TrajectoryRow.objects.filter(job_id=job_id)
    ids = set(
        job_rows.filter(Q(end__gte=lo, start__lte=hi) | Q(group__in=groups)).values_list(
            "pk", flat=True
        )
    )
    # The last trajectory of each slot that ended before the range (whose end may have freed
    # the slot a traced trajectory took). A correlated subquery, not DISTINCT ON: SQLite is
    # the embedded default and has no DISTINCT ON.
    latest = (
        job_rows.filter(end__lt=lo, slot=OuterRef("slot")).order_by("-end", "-pk").values("pk")[:1]
    )
    before = job_rows.filter(end__lt=lo, pk=Subquery(latest))
    ids.update(before.values_list("pk", flat=True))
    loaded = job_rows.filter(pk__in=ids)
    known = set(loaded.values_list("trainer_id", flat=True))
    pending = set(loaded.exclude(predecessor="").values_list("predecessor", flat=True)) - known
    while pending:
        found = list(
            job_rows.filter(trainer_id__in=pending).values_list("pk", "trainer_id", "predecessor")
        )
        known |= pending
        ids.update(pk for pk, _, _ in found)
        pending = {pred for _, _, pred in found if pred} - known
    return ids


def _trajectories(ids: set[int]) -> list[Trajectory]:
    phases: dict[int, list[Phase]] = {}
    for tid, kind, start, end in TrajectoryPhase.objects.filter(trajectory_id__in=ids).values_list(
        "trajectory_id", "kind", "start", "end"
    ):
        phases.setdefault(tid, []).append(Phase(kind, start, end))
    fields = ("pk", "trainer_id", "slot", "group", "start", "end", "failed", "predecessor")
    return [
        Trajectory(
            id=trainer_id,
            slot=slot,
            group=group,
            start=start,
            end=end,
            failed=failed,
            predecessor=predecessor or None,
            phases=tuple(phases.get(pk, ())),
        )
        for pk, trainer_id, slot, group, start, end, failed, predecessor in (
            TrajectoryRow.objects.filter(pk__in=ids).values_list(*fields)
        )
    ]


def attribute_from_rows(job_id: int, steps: Sequence[LearnerStep]) -> Attribution:
    """Attribute ``steps`` of one job from the raw rows (the source of truth), loading exactly
    the trajectories their span needs (module doc)."""
    if not steps:
        return attribute_steps([], [])
    span_lo = min(s.wait_start for s in steps)
    span_hi = max(s.train_end for s in steps)
    return attribute_steps(
        steps, _trajectories(_trajectory_ids(job_id, list(steps), span_lo, span_hi))
    )


def _seconds(rows: QuerySet, lo: float, hi: float) -> float:
    """Summed time of rows with ``start``/``end`` clipped to ``[lo, hi]``, in SQL."""
    clipped = Least(F("end"), hi) - Greatest(F("start"), lo)
    total = rows.filter(end__gt=lo, start__lt=hi).aggregate(
        s=Sum(clipped, output_field=FloatField())
    )["s"]
    return float(total or 0.0)


def waiting_share(job_id: int, lo: float, hi: float) -> float | None:
    """Summed acquisition over summed trajectory time in ``[lo, hi]``; each create once.

    A phase whose times came from Sandman's own acquisition (``from_sandman``) is counted
    once per distinct acquisition even if several trajectories name the same sandbox.
    """
    trajectories = TrajectoryRow.objects.filter(job_id=job_id)
    total = _seconds(trajectories, lo, hi)
    if total <= 0:
        return None
    phases = TrajectoryPhase.objects.filter(trajectory__job_id=job_id, kind__in=_ACQUISITION)
    trainer = _seconds(phases.filter(from_sandman=False), lo, hi)
    sandman = phases.filter(from_sandman=True, end__gt=lo, start__lt=hi)
    once = sum(
        min(end, hi) - max(start, lo)
        for start, end in sandman.values_list("start", "end").distinct()
    )
    return (trainer + once) / total


def _estimate(
    job_id: int, steps: list[LearnerStep], lo: float, hi: float
) -> FixedConcurrencyEstimate | None:
    """Little's law on the steps' groups: one aggregate over trajectories, one over phases."""
    groups = {g for s in steps for g in (*s.groups, *s.dropped_groups)}
    members = TrajectoryRow.objects.filter(job_id=job_id, group__in=groups)
    duration = ExpressionWrapper(F("end") - F("start"), output_field=FloatField())
    sums = members.aggregate(
        consumed=Count("pk", filter=Q(failed=False)),
        seconds=Sum(duration),
        lost=Sum(duration, filter=Q(failed=True)),
    )
    acquisition = TrajectoryPhase.objects.filter(
        trajectory__in=members.filter(failed=False), kind__in=_ACQUISITION
    ).aggregate(s=Sum(ExpressionWrapper(F("end") - F("start"), output_field=FloatField())))["s"]
    return fixed_concurrency_estimate(
        steps=len(steps),
        trajectories_consumed=sums["consumed"] or 0,
        trajectory_seconds=float(sums["seconds"] or 0.0),
        in_flight_seconds=_seconds(TrajectoryRow.objects.filter(job_id=job_id), lo, hi),
        span_seconds=hi - lo,
        measured_interval_s=sum(s.interval for s in steps) / len(steps),
        sandbox_seconds=float(acquisition or 0.0) + float(sums["lost"] or 0.0),
    )


def stored_attributions(step_pks: Sequence[int]) -> dict[int, StepAttribution]:
    """The stored attributions of these step rows (by row id); steps without one are absent."""
    rows = StepAttributionRollup.objects.filter(step_id__in=step_pks).values_list(
        "step_id", "step__step", "step__wait_start", "step__train_end", "seconds", "ended_by"
    )
    return {
        pk: StepAttribution(
            step=step,
            start=start,
            end=end,
            seconds={c: float(seconds.get(c, 0.0)) for c in CATEGORIES},
            ended_by=ended_by or None,
        )
        for pk, step, start, end, seconds, ended_by in rows
    }


@dataclass(frozen=True)
class AttributedSteps:
    """A job's steps in a range and their attribution, before the sums over trajectories
    (waiting share, estimate) that :func:`critical_path_of` adds."""

    attribution: Attribution
    steps: tuple[LearnerStep, ...]


def attributed_steps(
    job_id: int, *, lo: float | None = None, hi: float | None = None
) -> AttributedSteps:
    """Appendix J's attribution of one job's steps inside ``[lo, hi]`` (None: unbounded).

    Steps with a stored attribution (``StepAttributionRollup``) are read from it; the rest
    are attributed from the raw rows now, so the answer is the same either way."""
    rows = _steps(job_id, lo, hi)
    if not rows:
        return AttributedSteps(attribute_steps([], []), ())
    stored = stored_attributions([pk for pk, _ in rows])
    missing = [step for pk, step in rows if pk not in stored]
    fresh = attribute_from_rows(job_id, missing).per_step if missing else ()
    return AttributedSteps(combine([*stored.values(), *fresh]), tuple(step for _, step in rows))


def critical_path_of(job_id: int, attributed: AttributedSteps) -> CriticalPath:
    """The critical path of :func:`attributed_steps`' answer: its attribution with the
    waiting share and the estimate over the steps' span."""
    steps = list(attributed.steps)
    if not steps:
        return CriticalPath(attributed.attribution, None, None)
    span_lo = min(s.wait_start for s in steps)
    span_hi = max(s.train_end for s in steps)
    return CriticalPath(
        attribution=attributed.attribution,
        waiting_share=waiting_share(job_id, span_lo, span_hi),
        estimate=_estimate(job_id, steps, span_lo, span_hi),
    )


def critical_path(job_id: int, *, lo: float | None = None, hi: float | None = None) -> CriticalPath:
    """Appendix J for one job's steps inside ``[lo, hi]`` (epoch seconds; None: unbounded)."""
    return critical_path_of(job_id, attributed_steps(job_id, lo=lo, hi=hi))


def critical_paths_of(items: Sequence[tuple[int, AttributedSteps]]) -> list[CriticalPath]:
    """:func:`critical_path_of` for several jobs, in order: on PostgreSQL the waiting shares
    and estimates of all of them come from one query (``sandboxes.training_sums``), the same
    sums the per-job queries compute; elsewhere it is the per-job loop."""
    if connection.vendor != "postgresql":
        return [critical_path_of(job_id, attributed) for job_id, attributed in items]
    spans = [
        JobSpan(
            job_id=job_id,
            lo=min(s.wait_start for s in attributed.steps),
            hi=max(s.train_end for s in attributed.steps),
            groups=frozenset(g for s in attributed.steps for g in (*s.groups, *s.dropped_groups)),
        )
        for job_id, attributed in items
        if attributed.steps
    ]
    sums = grouped_sums(spans)
    by_job = {span.job_id: span for span in spans}
    out = []
    for job_id, attributed in items:
        span = by_job.get(job_id)
        if span is None:
            out.append(CriticalPath(attributed.attribution, None, None))
            continue
        found = sums[job_id]
        steps = attributed.steps
        total = found.in_flight_seconds
        out.append(
            CriticalPath(
                attribution=attributed.attribution,
                waiting_share=found.acquisition_seconds / total if total > 0 else None,
                estimate=fixed_concurrency_estimate(
                    steps=len(steps),
                    trajectories_consumed=found.consumed,
                    trajectory_seconds=found.member_seconds,
                    in_flight_seconds=total,
                    span_seconds=span.hi - span.lo,
                    measured_interval_s=sum(s.interval for s in steps) / len(steps),
                    sandbox_seconds=found.member_acquisition_seconds + found.lost_seconds,
                ),
            )
        )
    return out
