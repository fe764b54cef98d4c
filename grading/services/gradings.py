"""Writes of a grading's life: queued → running (a runner holds a lease) → done.

Rules a reader must not break:
* Every step is stored when it happens (an attempt is written BEFORE its sandbox is used),
  so a restart finds each grading where it was: a running grading whose runner's lease ran
  out is taken over and its open attempt recorded ``lost`` — retried, never scored.
* Infrastructure failures (``infrastructure``, ``lost``) use up ``max_attempts``; then the
  grading ends ``no_verdict``. A patch that does not apply and failing tests are valid
  verdicts (``unresolved``), never retried.
* A job with checked reuse takes no grading of a tag-referenced image unless it opted in
  (``sandboxes.imagerefs``, §4.3): the refusal is a 409 at the request, never a no_verdict.
* State moves go through ``_move`` (``GRADING_TRANSITIONS``); saves name their fields.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from grading import selectors
from grading.harness import HarnessResult, sha256_text
from grading.models import Grading, PatchCapture, Task
from grading.states import GRADING_TRANSITIONS, GradingState, TaskState
from grading.verdicts import Verdict
from sandboxes.imagerefs import tag_refusal
from sandboxes.states import JobState
from sandman_site import live
from sandman_site.errors import ImageNotPinned, InvalidInput, InvalidTransition, JobNotActive

INFRASTRUCTURE = frozenset({"infrastructure", "lost", "probe_refused"})
_DONE_FIELDS = [
    "attempts",
    "state",
    "state_changed_at",
    "verdict",
    "reason",
    "finished_at",
    "lease_until",
]


def grading_create(
    *,
    job: Any,
    task: Task,
    patch: str,
    capture: PatchCapture | None,
    suite_names: Sequence[str] | None,
    created_by: Any,
    now: dt.datetime,
    max_attempts: int = 3,
    certification: Any = None,
    preflight_kind: str = "",
    task_set: Any = None,
    shadow: bool = False,
) -> Grading:
    """Store a queued grading (a runner takes it from the database; nothing runs here).

    ``certification`` / ``preflight_kind``: a preflight grading (``grading.services.
    certifications``), which the job's certification check does not gate. ``task_set``: the
    grading is for that set, so a finished certification of it matching the job's
    configuration must have admitted the task (``NotCertified``, 409, says what differs)."""
    if job.state != JobState.ACTIVE:
        raise JobNotActive(f"job {job.pk} is {job.state}; it takes no new gradings.")
    if task.state != TaskState.ACTIVE:
        raise InvalidTransition(f"task {task.instance_id!r} is retired; it takes no gradings.")
    if task_set is not None:
        selectors.certification_for_grading(
            task_set=task_set,
            task=task,
            config=selectors.job_config(job),
            task_digest=selectors.task_digest_of(task),
        )
    if job.reuse_enabled and not job.reuse_allow_tags:
        refused = tag_refusal(
            task.image, task.base_commit, backend=settings.SANDMAN_BACKEND, use="reused"
        )
        if refused is not None:  # refused here, not as no_verdict after three acquires
            raise ImageNotPinned(refused, {"image": task.image, "task": task.instance_id})
    if capture is not None:
        if capture.task_id != task.pk or capture.job_id != job.pk:
            raise InvalidInput(f"capture {capture.pk} is not of this job and task.")
        patch = capture.patch
    by_name = {suite["name"]: suite for suite in task.suites}
    names = list(suite_names) if suite_names else list(by_name)
    unknown = [name for name in names if name not in by_name]
    if unknown:
        raise InvalidInput(
            f"task {task.instance_id!r} has no suite {unknown[0]!r} (it has {sorted(by_name)})."
        )
    return Grading.objects.create(
        job=job,
        task=task,
        capture=capture,
        patch=patch,
        patch_sha256=sha256_text(patch),
        suites=[by_name[name] for name in names],
        max_attempts=max_attempts,
        certification=certification,
        preflight_kind=preflight_kind,
        shadow_requested=shadow,
        created_by=created_by,
        created_at=now,
        state_changed_at=now,
    )


def grading_claim(
    *, runner: str, now: dt.datetime, lease_s: float, certification_id: int | None = None
) -> Grading | None:
    """Take the oldest queued grading, or a running one whose runner's lease ran out
    (only ``certification_id``'s preflight gradings when given).

    A taken-over grading had an attempt nobody will finish: it is recorded ``lost``; if
    that used the last attempt the grading ends ``no_verdict`` and the next is looked for.
    """
    scope = Grading.objects.all()
    if certification_id is not None:
        scope = scope.filter(certification_id=certification_id)
    while True:
        with transaction.atomic():
            grading = (
                scope.select_for_update(skip_locked=True)
                .filter(
                    Q(state=GradingState.QUEUED)
                    | Q(state=GradingState.RUNNING, lease_until__lt=now)
                )
                .order_by("created_at", "pk")
                .first()
            )
            if grading is None:
                return None
            if grading.state == GradingState.RUNNING:
                _record_lost(grading, now)
                if _infra_attempts(grading) >= grading.max_attempts:
                    _finish(
                        grading, verdict=Verdict.NO_VERDICT, reason=_no_verdict(grading), now=now
                    )
                    grading.save(update_fields=_DONE_FIELDS)
                    _publish_done(grading)
                    continue
            _move(grading, GradingState.RUNNING, now)
            grading.runner = runner
            grading.lease_until = now + dt.timedelta(seconds=lease_s)
            grading.started_at = grading.started_at or now
            grading.save(
                update_fields=[
                    "attempts",
                    "state",
                    "state_changed_at",
                    "runner",
                    "lease_until",
                    "started_at",
                ]
            )
            return grading


def grading_attempt_start(
    *,
    grading: Grading,
    sandbox_id: int | None,
    source: str,
    acquire_ms: float | None,
    now: dt.datetime,
    lease_s: float,
) -> None:
    """Record an attempt (``running``) before its sandbox is used; extend the lease."""
    grading.attempts.append(
        {
            "n": len(grading.attempts) + 1,
            "sandbox_id": sandbox_id,
            "source": source,
            "acquire_ms": acquire_ms,
            "started_at": now.isoformat(),
            "outcome": "running",
        }
    )
    grading.lease_until = now + dt.timedelta(seconds=lease_s)
    grading.save(update_fields=["attempts", "lease_until"])


def grading_attempt_probed(
    *, grading: Grading, readings: dict[str, Any], checks: list[dict[str, Any]]
) -> None:
    """Store the open attempt's ``/probe`` readings and the check of each declared field."""
    if not grading.attempts or grading.attempts[-1].get("outcome") != "running":
        raise InvalidTransition(f"grading {grading.pk} has no attempt in progress.")
    grading.attempts[-1].update(probe=readings, checks=checks)
    grading.save(update_fields=["attempts"])


def grading_attempt_failed(
    *, grading: Grading, detail: str, now: dt.datetime, outcome: str = "infrastructure"
) -> bool:
    """Close the open attempt (or record one that never got a sandbox) as an infrastructure
    failure or a probe refusal. True if another attempt is due; else ``no_verdict``."""
    if grading.attempts and grading.attempts[-1].get("outcome") == "running":
        attempt = grading.attempts[-1]
    else:
        attempt = {"n": len(grading.attempts) + 1, "sandbox_id": None, "source": ""}
        grading.attempts.append(attempt)
    attempt.update(outcome=outcome, detail=detail[:1000], ended_at=now.isoformat())
    if _infra_attempts(grading) >= grading.max_attempts:
        _finish(grading, verdict=Verdict.NO_VERDICT, reason=_no_verdict(grading), now=now)
        grading.save(update_fields=_DONE_FIELDS)
        _publish_done(grading)
        return False
    grading.save(update_fields=["attempts"])
    return True


def grading_decided(
    *, grading: Grading, result: HarnessResult, now: dt.datetime, duration_ms: float
) -> None:
    """Store the verdict of the open attempt: resolved, or a valid 0."""
    if not grading.attempts or grading.attempts[-1].get("outcome") != "running":
        raise InvalidTransition(f"grading {grading.pk} has no attempt in progress.")
    grading.attempts[-1].update(
        outcome=result.decision.verdict.value,
        ended_at=now.isoformat(),
        duration_ms=duration_ms,
        suites=[
            {"name": run.name, "exit_code": run.exit_code, "duration_ms": run.duration_ms}
            for run in result.suites
        ],
    )
    grading.tests = result.tests()
    grading.apply_step = result.apply_step or ""
    _finish(grading, verdict=result.decision.verdict, reason=result.decision.reason, now=now)
    grading.save(update_fields=[*_DONE_FIELDS, "tests", "apply_step"])
    _publish_done(grading)


def _publish_done(grading: Grading) -> None:
    """Tell the operator pages a verdict is stored (after the commit that stored it)."""
    payload = {
        "grading_id": grading.pk,
        "job_id": grading.job_id,
        "verdict": grading.verdict,
        "at": grading.finished_at,
    }
    transaction.on_commit(lambda: live.publish("grading.state", payload))


def _record_lost(grading: Grading, now: dt.datetime) -> None:
    open_attempts = [a for a in grading.attempts if a.get("outcome") == "running"]
    for attempt in open_attempts:
        attempt.update(
            outcome="lost", detail="the runner stopped mid-grading", ended_at=now.isoformat()
        )
    if not open_attempts:
        grading.attempts.append(
            {"n": len(grading.attempts) + 1, "outcome": "lost", "detail": "runner stopped"}
        )


def _infra_attempts(grading: Grading) -> int:
    return sum(1 for a in grading.attempts if a.get("outcome") in INFRASTRUCTURE)


def _no_verdict(grading: Grading) -> str:
    last = grading.attempts[-1].get("detail", "") if grading.attempts else ""
    text = (
        f"no_verdict: {_infra_attempts(grading)} attempts failed (infrastructure or probe); {last}"
    )
    return text[:500]


def _move(grading: Grading, to: str, now: dt.datetime) -> None:
    if to not in GRADING_TRANSITIONS[grading.state]:
        raise InvalidTransition(
            f"grading {grading.pk} cannot go from {grading.state} to {to}.",
            {"from": grading.state, "to": to},
        )
    grading.state = to
    grading.state_changed_at = now


def _finish(grading: Grading, *, verdict: Verdict, reason: str, now: dt.datetime) -> None:
    _move(grading, GradingState.DONE, now)
    grading.verdict = verdict.value
    grading.reason = reason[:500]
    grading.finished_at = now
    grading.lease_until = None
