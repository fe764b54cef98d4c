"""The stored attribution of learner steps (``StepAttributionRollup``): refresh and invalidate.

The raw trajectories, phases and steps stay the source of truth; a stored attribution is the
answer ``sandboxes.training_selectors.attribute_from_rows`` gives for that step, kept so the
critical-path API and the training page read one row per step instead of re-walking every
trajectory (issue 11 item 6: a month of records within 1 s).

Rules a reader must not break:

* Same numbers as the raw path: a row is written only from ``attribute_from_rows`` and only
  while the job row is locked (``select_for_update``), the lock ``trajectories_report`` takes
  too, so a batch of late trajectories is either seen by the computation or deletes the rows
  after it (:func:`step_attributions_invalidate`, in the ingest's own transaction).
* A trajectory can change only the attribution of steps that end after it starts (the walk
  goes back in time from the member that ended a wait) or that admit its group; those rows
  are deleted when it arrives, whatever its times. Steps without a row are attributed from
  raw rows at read time, so a read never sees a stale row, only a slower one.
* Idempotent: refreshing twice writes nothing the second time; it returns counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import transaction

from sandboxes.models import Job, LearnerStep, StepAttributionRollup
from sandboxes.training_selectors import attribute_from_rows, step_records

BATCH_STEPS = 200


def step_attributions_invalidate(*, job_id: int, since: float, groups: Iterable[str]) -> int:
    """Delete the stored attributions a trajectory starting at ``since`` (or later) in one of
    ``groups`` could change: steps of the job ending at or after ``since``, and steps that
    admitted (or dropped) one of ``groups``. Call inside the writer's transaction."""
    wanted = set(groups)
    stale = set(
        StepAttributionRollup.objects.filter(job_id=job_id, train_end__gte=since).values_list(
            "step_id", flat=True
        )
    )
    if wanted:
        earlier = StepAttributionRollup.objects.filter(job_id=job_id, train_end__lt=since)
        for pk, admitted, dropped in earlier.values_list(
            "step_id", "step__groups", "step__dropped_groups"
        ):
            if wanted.intersection(admitted) or wanted.intersection(dropped):
                stale.add(pk)
    if not stale:
        return 0
    deleted, _ = StepAttributionRollup.objects.filter(step_id__in=stale).delete()
    return deleted


def _refresh_batch(job_id: int, *, now: datetime, batch: int) -> int:
    with transaction.atomic():
        Job.objects.select_for_update().only("pk").get(pk=job_id)
        pks = list(
            LearnerStep.objects.filter(job_id=job_id, attribution__isnull=True)
            .order_by("step")
            .values_list("pk", flat=True)[:batch]
        )
        if not pks:
            return 0
        rows = step_records(LearnerStep.objects.filter(pk__in=pks))
        results = attribute_from_rows(job_id, [step for _, step in rows]).per_step
        pk_of = {step.step: pk for pk, step in rows}
        StepAttributionRollup.objects.bulk_create(
            [
                StepAttributionRollup(
                    step_id=pk_of[r.step],
                    job_id=job_id,
                    train_end=r.end,
                    seconds=dict(r.seconds),
                    ended_by=r.ended_by or "",
                    computed_at=now,
                )
                for r in results
            ]
        )
        return len(results)


def step_attributions_refresh(
    *, now: datetime, job_id: int | None = None, batch: int = BATCH_STEPS
) -> int:
    """Store the attribution of every step (of ``job_id``, or of all jobs) that has none.

    One transaction per ``batch`` steps of one job, the job row locked; returns the rows
    written."""
    jobs = LearnerStep.objects.filter(attribution__isnull=True)
    if job_id is not None:
        jobs = jobs.filter(job_id=job_id)
    written = 0
    for job in sorted(set(jobs.values_list("job_id", flat=True))):
        while True:
            n = _refresh_batch(job, now=now, batch=batch)
            written += n
            if n < batch:
                break
    return written
