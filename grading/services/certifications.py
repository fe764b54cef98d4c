"""Writes of preflight and certification: start a task set's preflight under a job, advance it
as its gradings finish, and finish the record with its chain (§4.3).

Rules a reader must not break:
* Preflight gradings are ordinary gradings (``grading_create`` with ``certification`` and
  ``preflight_kind``) graded by the grading runner under the job's own configuration, so
  preflight sees exactly what the job's gradings will see.
* ``certification_advance`` is idempotent and recomputes each undecided task's state from
  its stored gradings (``grading.certify.next_step``); it runs with the certification row
  locked, so two runners never queue the same next grading. A restart loses nothing: the
  next advance finds the same gradings.
* An advance never raises for one task: a next grading that cannot be queued (the job was
  drained, the task retired) rejects that task with the reason, so the runner that calls
  it keeps grading everything else.
* ``results[instance_id]`` keeps every verdict (grading id, kind, verdict, reason); the
  chain is written once, when every task is decided (state ``done``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction

from grading import certify
from grading.models import Certification, Grading, Task, TaskSet
from grading.selectors import job_config, task_digest_of
from grading.services.gradings import grading_create
from grading.states import (
    CERTIFICATION_TRANSITIONS,
    CertificationState,
    GradingState,
    TaskState,
)
from sandboxes.states import JobState
from sandman_site.errors import InvalidInput, InvalidTransition, JobNotActive, SandmanError


def certification_start(
    *, task_set: TaskSet, job: Any, created_by: Any, now: dt.datetime
) -> Certification:
    """Store a running certification and queue the first reference grading of every task."""
    if job.state != JobState.ACTIVE:
        raise JobNotActive(f"job {job.pk} is {job.state}; it runs no preflight.")
    tasks = list(task_set.tasks.filter(state=TaskState.ACTIVE).order_by("instance_id"))
    if not tasks:
        raise InvalidInput(f"task set {task_set.name!r} has no active task to certify.")
    config = job_config(job)
    with transaction.atomic():
        cert = Certification.objects.create(
            task_set=task_set,
            job=job,
            config=config,
            config_hash=certify.canonical_hash(config),
            results={
                task.instance_id: {
                    "digest": task_digest_of(task),
                    "admitted": None,
                    "reason": "",
                    "verdicts": [],
                }
                for task in tasks
            },
            created_by=created_by,
            created_at=now,
            state_changed_at=now,
        )
        for task in tasks:
            _queue(cert, task, certify.REFERENCE, now)
    return cert


def _queue(cert: Certification, task: Task, kind: str, now: dt.datetime) -> Grading:
    return grading_create(
        job=cert.job,
        task=task,
        patch=task.patch if kind == certify.REFERENCE else "",
        capture=None,
        suite_names=None,
        created_by=cert.created_by,
        now=now,
        certification=cert,
        preflight_kind=kind,
    )


def certification_advance(*, certification_id: int, now: dt.datetime) -> Certification:
    """Fold finished preflight gradings into the record, queue what is due, finish it."""
    with transaction.atomic():
        cert = Certification.objects.select_for_update().get(pk=certification_id)
        if cert.state == CertificationState.DONE:
            return cert
        gradings = list(cert.gradings.select_related("task").order_by("pk"))
        by_task: dict[str, list[Grading]] = {}
        for grading in gradings:
            by_task.setdefault(grading.task.instance_id, []).append(grading)
        for instance_id, result in cert.results.items():
            if result["admitted"] is not None:
                continue
            mine = by_task.get(instance_id, [])
            result["verdicts"] = [
                {
                    "grading": g.pk,
                    "kind": g.preflight_kind,
                    "verdict": g.verdict,
                    "reason": g.reason,
                }
                for g in mine
                if g.state == GradingState.DONE
            ]
            if any(g.state != GradingState.DONE for g in mine):
                continue  # a grading of this task is still queued or running
            step = certify.next_step(result["verdicts"])
            if step.grade is None:
                result["admitted"], result["reason"] = step.admitted, step.reason
                continue
            try:
                with transaction.atomic():
                    _queue(cert, mine[0].task, step.grade, now)
            except SandmanError as exc:  # the job was drained or the task retired meanwhile
                result["admitted"] = False
                result["reason"] = f"preflight could not grade it again: {exc.message}"
        if all(r["admitted"] is not None for r in cert.results.values()):
            _finish(cert, now)
        cert.save(
            update_fields=[
                "results",
                "admitted",
                "chain",
                "state",
                "state_changed_at",
                "finished_at",
            ]
        )
    return cert


def certification_advance_running(*, now: dt.datetime) -> int:
    """Advance every running certification (the grading runner calls this); how many."""
    ids = list(
        Certification.objects.filter(state=CertificationState.RUNNING).values_list("pk", flat=True)
    )
    for pk in ids:
        certification_advance(certification_id=pk, now=now)
    return len(ids)


def _finish(cert: Certification, now: dt.datetime) -> None:
    if CertificationState.DONE not in CERTIFICATION_TRANSITIONS[cert.state]:
        raise InvalidTransition(f"certification {cert.pk} cannot go from {cert.state} to done.")
    admitted = sorted(iid for iid, r in cert.results.items() if r["admitted"])
    cert.admitted = admitted
    cert.chain = certify.chain(cert.config_hash, [cert.results[iid]["digest"] for iid in admitted])
    cert.state = CertificationState.DONE
    cert.state_changed_at = now
    cert.finished_at = now
