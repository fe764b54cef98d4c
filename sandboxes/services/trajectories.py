"""Ingest of the trainer's trajectories and learner steps (issue 11, item 1; Appendix J records).

Rules a reader must not break:

* All or nothing: every record of a batch is checked before anything is written; the first
  bad record is refused as ``InvalidInput`` with its ``index`` and nothing is stored.
* Idempotent by the trainer's ids: a trajectory id (or step number) already stored for the
  job, or repeated inside the batch, changes nothing and is counted in ``duplicates``. The
  job row is locked for the write so two concurrent batches cannot both insert one id.
* Live push: a batch that stored anything publishes ``trajectories`` or ``learner_steps``
  ``{job_id, stored, at}`` after commit (``sandman_site.live``; the training page follows).
* Stored step attributions a new trajectory could change are deleted in the same transaction
  (``services.step_rollups``); a read attributes those steps from raw rows until the next
  refresh stores them again.
* Sandman's own acquisition times win: an acquisition phase of a trajectory whose sandbox ids
  name an acquisition Sandman recorded for the job takes Sandman's start and end (clipped to
  the trajectory), matched by role and nearest start, each acquisition used once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from sandboxes.critical_path import PHASE_KINDS
from sandboxes.models import Acquisition, Job, LearnerStep, Trajectory, TrajectoryPhase
from sandboxes.services._publish import publish_on_commit
from sandboxes.services.step_rollups import step_attributions_invalidate
from sandboxes.states import Role
from sandman_site.errors import InvalidInput

# Phases may touch their trajectory's bounds; float rounding on the trainer's side is no error.
_TOLERANCE_S = 1e-6
_ROLE_OF_KIND = {"rollout_acquisition": Role.ROLLOUT, "grading_acquisition": Role.GRADING}


@dataclass(frozen=True)
class ReportCounts:
    """What a batch did: records received, newly stored, and duplicates that changed nothing."""

    received: int
    stored: int
    duplicates: int


def _refuse(index: int, sentence: str) -> InvalidInput:
    return InvalidInput(f"record {index}: {sentence}", {"index": index})


def _check_trajectory(index: int, record: Mapping[str, Any]) -> None:
    start, end = record["start"], record["end"]
    if end < start:
        raise _refuse(index, "end is before start")
    if record.get("predecessor") == record["id"]:
        raise _refuse(index, "a trajectory cannot be its own predecessor")
    for phase in record["phases"]:
        if phase["kind"] not in PHASE_KINDS:
            raise _refuse(index, f"unknown phase kind {phase['kind']!r}")
        if phase["end"] < phase["start"]:
            raise _refuse(index, f"phase {phase['kind']} ends before it starts")
        if phase["start"] < start - _TOLERANCE_S or phase["end"] > end + _TOLERANCE_S:
            raise _refuse(index, f"phase {phase['kind']} lies outside its trajectory")


def _check_step(index: int, record: Mapping[str, Any]) -> None:
    if not record["wait_start"] <= record["wait_end"] <= record["train_end"]:
        raise _refuse(index, "needs wait_start <= wait_end <= train_end")
    handover = record.get("handover_end")
    if handover is not None and not record["wait_end"] <= handover <= record["train_end"]:
        raise _refuse(index, "needs wait_end <= handover_end <= train_end")


def _new_records(
    records: Sequence[Mapping[str, Any]], key: str, stored: set[Any]
) -> list[Mapping[str, Any]]:
    """The records whose ``key`` is neither stored nor seen earlier in the batch."""
    seen = set(stored)
    fresh = []
    for record in records:
        if record[key] in seen:
            continue
        seen.add(record[key])
        fresh.append(record)
    return fresh


def _sandman_acquisitions(job_id: int, records: Sequence[Mapping[str, Any]]) -> dict[int, list]:
    """Finished acquisitions of the job for the sandbox ids named, by sandbox id."""
    ids = {sid for record in records for sid in record.get("sandbox_ids", ())}
    found: dict[int, list] = {}
    if not ids:
        return found
    rows = Acquisition.objects.filter(
        job_id=job_id, sandbox_id__in=ids, finished_at__isnull=False
    ).values_list("sandbox_id", "role", "started_at", "finished_at")
    for sandbox_id, role, started, finished in rows:
        found.setdefault(sandbox_id, []).append((role, started, finished))
    return found


def _phases_of(
    trajectory: Trajectory, record: Mapping[str, Any], acquisitions: dict[int, list]
) -> list[TrajectoryPhase]:
    """The trajectory's phases, Sandman's acquisition times replacing the trainer's."""
    pool: list[tuple[str, datetime, datetime]] = []
    for sid in record.get("sandbox_ids", ()):
        pool.extend(acquisitions.get(sid, ()))
    phases = []
    for phase in record["phases"]:
        start, end, from_sandman = phase["start"], phase["end"], False
        role = _ROLE_OF_KIND.get(phase["kind"])
        candidates = [a for a in pool if a[0] == role]
        if candidates:
            best = min(candidates, key=lambda a: abs(a[1].timestamp() - phase["start"]))
            pool.remove(best)
            start = min(max(best[1].timestamp(), trajectory.start), trajectory.end)
            end = min(max(best[2].timestamp(), start), trajectory.end)
            from_sandman = True
        phases.append(
            TrajectoryPhase(
                trajectory=trajectory,
                kind=phase["kind"],
                start=start,
                end=end,
                from_sandman=from_sandman,
            )
        )
    return phases


def trajectories_report(
    *, job_id: int, records: Sequence[Mapping[str, Any]], now: datetime
) -> ReportCounts:
    """Store a batch of trajectories (wire-format dicts) for one job, all or nothing."""
    for index, record in enumerate(records):
        _check_trajectory(index, record)
    with transaction.atomic():
        Job.objects.select_for_update().only("pk").get(pk=job_id)
        stored = set(
            Trajectory.objects.filter(
                job_id=job_id, trainer_id__in={r["id"] for r in records}
            ).values_list("trainer_id", flat=True)
        )
        fresh = _new_records(records, "id", stored)
        rows = Trajectory.objects.bulk_create(
            [
                Trajectory(
                    job_id=job_id,
                    trainer_id=r["id"],
                    slot=r["slot"],
                    group=r["group"],
                    start=r["start"],
                    end=r["end"],
                    failed=r["failed"],
                    predecessor=r.get("predecessor") or "",
                    sandbox_ids=list(r.get("sandbox_ids", ())),
                    received_at=now,
                )
                for r in fresh
            ]
        )
        acquisitions = _sandman_acquisitions(job_id, fresh)
        phases = [
            p for row, r in zip(rows, fresh, strict=True) for p in _phases_of(row, r, acquisitions)
        ]
        TrajectoryPhase.objects.bulk_create(phases)
        if fresh:
            step_attributions_invalidate(
                job_id=job_id,
                since=min(r["start"] for r in fresh),
                groups={r["group"] for r in fresh},
            )
            publish_on_commit("trajectories", {"job_id": job_id, "stored": len(fresh), "at": now})
    return ReportCounts(
        received=len(records), stored=len(fresh), duplicates=len(records) - len(fresh)
    )


def learner_steps_report(
    *, job_id: int, records: Sequence[Mapping[str, Any]], now: datetime
) -> ReportCounts:
    """Store a batch of learner steps for one job, all or nothing, idempotent by step number."""
    for index, record in enumerate(records):
        _check_step(index, record)
    with transaction.atomic():
        Job.objects.select_for_update().only("pk").get(pk=job_id)
        stored = set(
            LearnerStep.objects.filter(
                job_id=job_id, step__in={r["step"] for r in records}
            ).values_list("step", flat=True)
        )
        fresh = _new_records(records, "step", stored)
        LearnerStep.objects.bulk_create(
            [
                LearnerStep(
                    job_id=job_id,
                    step=r["step"],
                    wait_start=r["wait_start"],
                    wait_end=r["wait_end"],
                    handover_end=r.get("handover_end"),
                    train_end=r["train_end"],
                    groups=list(r["groups"]),
                    dropped_groups=list(r.get("dropped_groups") or ()),
                    received_at=now,
                )
                for r in fresh
            ]
        )
        if fresh:
            publish_on_commit("learner_steps", {"job_id": job_id, "stored": len(fresh), "at": now})
    return ReportCounts(
        received=len(records), stored=len(fresh), duplicates=len(records) - len(fresh)
    )
