"""Job writes: register a job, move it to draining and drained.

A job is validated completely before its row is written: bad numbers raise
``InvalidInput`` and leave no record. Pool settings (pacing, caps, warm policy,
lifetimes) are fixed at creation; the controller reads them once per job. The only
later change is the state: ``active`` → ``draining`` → ``drained``.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from django.db import transaction

from sandboxes import placement
from sandboxes.models import Job
from sandboxes.services._publish import publish_on_commit
from sandboxes.states import Egress, JobState, SandboxState
from sandman_site.errors import InvalidInput, JobNotDrained, NotFound


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InvalidInput(message)


def _finite(value: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _validate(
    *,
    name: str,
    rate_per_s: float,
    burst: int,
    max_live: int,
    max_creating: int,
    warm_per_key: int,
    idle_timeout_s: float,
    readiness_budget_s: float,
    max_lifetime_s: float,
    egress: str,
    reuse_max_uses: int,
) -> None:
    _require(
        isinstance(name, str) and 0 < len(name.strip()) <= 200, "name must be 1–200 characters"
    )
    _require(_finite(rate_per_s) and rate_per_s > 0, "pacing.rate_per_s must be a positive number")
    for field, value, low in (
        ("pacing.burst", burst, 1),
        ("caps.max_live", max_live, 1),
        ("caps.max_creating", max_creating, 1),
        ("warm.per_key", warm_per_key, 0),
        ("reuse.max_uses", reuse_max_uses, 1),
    ):
        _require(
            isinstance(value, int) and not isinstance(value, bool) and low <= value <= 1_000_000,
            f"{field} must be an integer between {low} and 1000000",
        )
    for field, seconds in (
        ("warm.idle_timeout_s", idle_timeout_s),
        ("readiness_budget_s", readiness_budget_s),
        ("max_lifetime_s", max_lifetime_s),
    ):
        _require(
            _finite(seconds) and 0 < seconds <= 7 * 86400, f"{field} must be between 0 and 604800"
        )
    _require(warm_per_key <= max_live, "warm.per_key cannot exceed caps.max_live")
    _require(egress in Egress.values, f"egress must be one of {', '.join(Egress.values)}")


# A Kubernetes pod carries the script in an annotation (256 KiB for all of them).
STARTUP_SCRIPT_MAX_BYTES = 64 * 1024


def job_create(
    *,
    owner: Any,
    name: str,
    trainer_pod_name: str = "",
    trainer_pod_uid: str = "",
    rate_per_s: float = 25.0,
    burst: int = 25,
    max_live: int = 256,
    max_creating: int = 64,
    warm_per_key: int = 0,
    idle_timeout_s: float = 300.0,
    readiness_budget_s: float = 120.0,
    max_lifetime_s: float = 1800.0,
    egress: str = Egress.DENY,
    reuse_enabled: bool = False,
    reuse_max_uses: int = 8,
    reuse_allow_tags: bool = False,
    node_pool: str = "",
    node_selector: dict[str, str] | None = None,
    startup_script: str = "",
    now: dt.datetime,
) -> Job:
    """Register a job after validating every field (nothing is written on bad input)."""
    _validate(
        name=name,
        rate_per_s=rate_per_s,
        burst=burst,
        max_live=max_live,
        max_creating=max_creating,
        warm_per_key=warm_per_key,
        idle_timeout_s=idle_timeout_s,
        readiness_budget_s=readiness_budget_s,
        max_lifetime_s=max_lifetime_s,
        egress=egress,
        reuse_max_uses=reuse_max_uses,
    )
    _require(len(trainer_pod_name) <= 253, "trainer_pod.name is longer than 253 characters")
    _require(len(trainer_pod_uid) <= 64, "trainer_pod.uid is longer than 64 characters")
    selector = placement.check_selector(node_selector or {}, where="placement.node_selector")
    if node_pool:
        placement.check_label("pool", node_pool, where="placement.node_pool")
    _require(
        len(startup_script.encode()) <= STARTUP_SCRIPT_MAX_BYTES,
        f"startup_script is longer than {STARTUP_SCRIPT_MAX_BYTES} bytes",
    )
    _require("\0" not in startup_script, "startup_script must not contain NUL bytes")
    with transaction.atomic():
        job = Job.objects.create(
            owner=owner,
            name=name.strip(),
            trainer_pod_name=trainer_pod_name,
            trainer_pod_uid=trainer_pod_uid,
            rate_per_s=float(rate_per_s),
            burst=burst,
            max_live=max_live,
            max_creating=max_creating,
            warm_per_key=warm_per_key,
            idle_timeout_s=float(idle_timeout_s),
            readiness_budget_s=float(readiness_budget_s),
            max_lifetime_s=float(max_lifetime_s),
            egress=egress,
            reuse_enabled=bool(reuse_enabled),
            reuse_max_uses=reuse_max_uses,
            reuse_allow_tags=bool(reuse_allow_tags),
            node_pool=node_pool,
            node_selector=selector,
            startup_script=startup_script,
            created_at=now,
        )
        publish_on_commit("job.state", {"job_id": job.pk, "state": job.state, "at": now})
    return job


def _set_state(*, job_id: int, allowed_from: set[str], to: str, now: dt.datetime) -> bool:
    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None:
            raise NotFound(f"job {job_id} does not exist")
        if job.state == to:
            return False
        if job.state not in allowed_from:
            return False
        job.state = to
        fields = ["state"]
        if to == JobState.DRAINED:
            job.drained_at = now
            fields.append("drained_at")
        job.save(update_fields=fields)
        publish_on_commit("job.state", {"job_id": job.pk, "state": to, "at": now})
    return True


def job_mark_draining(*, job_id: int, now: dt.datetime) -> bool:
    """``active`` → ``draining``; False if the job was already draining or drained."""
    return _set_state(job_id=job_id, allowed_from={JobState.ACTIVE}, to=JobState.DRAINING, now=now)


def job_mark_drained(*, job_id: int, now: dt.datetime) -> bool:
    """``draining`` → ``drained`` once nothing of the job is left on the backend."""
    return _set_state(job_id=job_id, allowed_from={JobState.DRAINING}, to=JobState.DRAINED, now=now)


def job_delete(*, job_id: int) -> None:
    """Delete a drained job and its records (sandbox rows, events, acquisitions,
    trajectories); refused (409 ``job_not_drained``) while the job is not ``drained``,
    while any sandbox of it is not ``deleted`` or has a delete pending, or while a
    grading still refers to it. One transaction: all of it goes, or nothing."""
    from sandboxes.models import Acquisition, PendingDelete, Sandbox

    with transaction.atomic():
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None:
            raise NotFound(f"job {job_id} does not exist")
        if job.state != JobState.DRAINED:
            raise JobNotDrained(
                f"job {job_id} is {job.state}; drain it first", {"state": job.state}
            )
        sandboxes = Sandbox.objects.filter(job_id=job_id)
        left = sandboxes.exclude(state=SandboxState.DELETED).count()
        pending = PendingDelete.objects.filter(sandbox__job_id=job_id).count()
        if left or pending:
            raise JobNotDrained(
                f"job {job_id} still has {left} sandbox(es) not deleted "
                f"and {pending} pending delete(s)",
                {"sandboxes_left": left, "pending_deletes": pending},
            )
        if job.gradings.exists():  # the grading app's reverse name
            raise JobNotDrained(f"job {job_id} has gradings; they keep it", {"gradings": True})
        Acquisition.objects.filter(job_id=job_id).delete()
        sandboxes.delete()
        job.delete()
