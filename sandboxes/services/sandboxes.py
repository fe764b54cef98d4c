"""Sandbox writes: the row before the create, every state change, and its timeline.

Ordering rules a reader must not break (paper §4.4, Appendix F):
* ``sandbox_request`` writes the row (state ``requested``, name, nonce, token) BEFORE the
  controller sends the create, so a restart can always find what the backend may hold.
* Every state change goes through :func:`sandbox_transition` (or :func:`sandbox_move`): it
  locks the row, applies the move by ``moves.plan_move`` (refuses moves not in
  ``SANDBOX_TRANSITIONS`` with ``InvalidTransition``, stamps the state's time field),
  saves with ``update_fields`` and records a ``state`` event in one transaction.
  ``batch.py`` applies the same moves to many rows with one query of each kind.
  Services that change a row more than once per commit (hand-out, release + delete)
  lock it once and call :func:`transition_locked`, the same rules without a second read
  or a savepoint; it must only be called inside the transaction holding that lock.
* Times the backend reports (``ReadyInfo.timeline``) are stamped as reported, not as
  "now", so create-to-Ready is the backend's, not the controller's queue.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterable
from typing import Any

from django.db import transaction

from execd.tokens import derive_token
from sandboxes import events
from sandboxes.models import Job, Sandbox, SandboxEvent
from sandboxes.providers.base import ReadyInfo
from sandboxes.services._publish import publish_on_commit
from sandboxes.services.moves import (
    Event,
    SandboxMove,
    creating_move,
    handle_move,
    plan_move,
    ready_move,
    release_move,
)
from sandboxes.states import SANDBOX_TRANSITIONS, SandboxState
from sandman_site.errors import (
    AlreadyReleased,
    InvalidTransition,
    NotFound,
    SandboxLost,
    SandmanError,
)

# failure_reason of a sandbox the backend lost while Ready or handed out.
LOST_PREFIX = "lost: "
_LOSABLE = (SandboxState.READY, SandboxState.IN_USE, SandboxState.RELEASED)


def new_sandbox_name(job_id: int) -> str:
    """A DNS-1123 label, unique with overwhelming probability: ``sm-<job>-<12 hex>``."""
    return f"sm-{job_id}-{secrets.token_hex(6)}"


def payload(sandbox: Sandbox, **extra: Any) -> dict[str, Any]:
    return {
        "sandbox_id": sandbox.pk,
        "job_id": sandbox.job_id,
        "name": sandbox.name,
        "state": sandbox.state,
        "role": sandbox.role,
        "source": sandbox.source,
        "key_hash": sandbox.key_hash,
        "image": sandbox.image,
        **extra,
    }


def _lock(sandbox_id: int) -> Sandbox:
    sandbox = Sandbox.objects.select_for_update().filter(pk=sandbox_id).first()
    if sandbox is None:
        raise NotFound(f"sandbox {sandbox_id} does not exist")
    return sandbox


def add_events(sandbox: Sandbox, items: Iterable[Event]) -> None:
    SandboxEvent.objects.bulk_create(
        [
            SandboxEvent(sandbox=sandbox, kind=kind, at=at, detail=detail)
            for kind, at, detail in items
        ]
    )


def sandbox_request(
    *,
    job: Job | None = None,
    job_id: int | None = None,
    role: str,
    image: str,
    base_commit: str | None,
    cpu_millis: int,
    memory_bytes: int,
    workspace_bytes: int | None,
    key_hash: str,
    backend: str,
    now: dt.datetime,
) -> Sandbox:
    """Write the row of a create about to be sent (state ``requested``).

    Pass the ``job`` or its ``job_id`` (the controller passes the id: no ORM object
    crosses into its event loop).
    """
    with transaction.atomic():
        if job is None:
            if job_id is None:
                raise NotFound("a sandbox request needs a job")
            job = Job.objects.filter(pk=job_id).only("pk", "egress", "execd_key").first()
            if job is None:
                raise NotFound(f"job {job_id} does not exist")
        name = new_sandbox_name(job.pk)
        sandbox = Sandbox.objects.create(
            job=job,
            name=name,
            nonce=secrets.token_hex(16),
            # What the sandbox's execd derives from the job's key and its own name.
            token=derive_token(job.execd_key.encode(), name),
            backend=backend,
            role=role,
            state=SandboxState.REQUESTED,
            image=image,
            base_commit=base_commit or "",
            cpu_millis=cpu_millis,
            memory_bytes=memory_bytes,
            workspace_bytes=workspace_bytes,
            key_hash=key_hash,
            egress=job.egress,
            requested_at=now,
        )
        add_events(sandbox, [(events.STATE, now, {"from": "", "to": SandboxState.REQUESTED})])
        publish_on_commit("sandbox.state", payload(sandbox, previous="", at=now))
    return sandbox


def sandbox_transition(
    *,
    sandbox_id: int,
    to: str,
    now: dt.datetime,
    fields: dict[str, Any] | None = None,
    extra_events: Iterable[Event] = (),
    reason: str = "",
) -> Sandbox:
    """Move a sandbox to ``to`` (must be allowed), stamp, save and record the event."""
    with transaction.atomic():
        return transition_locked(
            _lock(sandbox_id),
            to=to,
            now=now,
            fields=fields,
            extra_events=extra_events,
            reason=reason,
        )


def transition_locked(
    sandbox: Sandbox,
    *,
    to: str,
    now: dt.datetime,
    fields: dict[str, Any] | None = None,
    extra_events: Iterable[Event] = (),
    reason: str = "",
) -> Sandbox:
    """:func:`sandbox_transition` for a row the caller locked in ITS open transaction.

    For services that lock once and change the row more than once in one commit (a
    hand-out, a release and its delete): no second SELECT and no savepoint per step.
    """
    return apply_locked(
        sandbox,
        SandboxMove(
            sandbox_id=sandbox.pk,
            now=now,
            to=to,
            fields=fields or {},
            events=tuple(extra_events),
            reason=reason,
        ),
    )


def apply_locked(sandbox: Sandbox, move: SandboxMove) -> Sandbox:
    """Apply one move (``moves.plan_move``) to a row locked in the caller's transaction."""
    planned = plan_move(sandbox, move)
    sandbox.save(update_fields=sorted(planned.changed))
    add_events(sandbox, planned.events)
    if move.to is not None and move.publish:
        publish_on_commit("sandbox.state", payload(sandbox, previous=planned.previous, at=move.now))
    return sandbox


def sandbox_move(*, move: SandboxMove) -> Sandbox:
    """Lock the row and apply one move in one transaction (``batch.py`` does many)."""
    with transaction.atomic():
        return apply_locked(_lock(move.sandbox_id), move)


def sandbox_mark_creating(*, sandbox_id: int, now: dt.datetime) -> Sandbox:
    """The create is about to be sent (after the pacer and a creating slot)."""
    return sandbox_move(move=creating_move(sandbox_id=sandbox_id, now=now))


def sandbox_record_handle(
    *, sandbox_id: int, uid: str, ref: str, api_created_at: dt.datetime, now: dt.datetime
) -> None:
    """The backend stored the create: keep its identity (for deletes after a restart)."""
    sandbox_move(
        move=handle_move(
            sandbox_id=sandbox_id, uid=uid, ref=ref, api_created_at=api_created_at, now=now
        )
    )


def sandbox_mark_ready(*, sandbox_id: int, info: ReadyInfo, now: dt.datetime) -> Sandbox:
    """Ready: record the address and every time the backend reported."""
    return sandbox_move(move=ready_move(sandbox_id=sandbox_id, info=info, now=now))


def sandbox_mark_healthy(*, sandbox_id: int, now: dt.datetime, healthy: bool) -> None:
    """Record one health check (before a warm hand-out)."""
    with transaction.atomic():
        sandbox = _lock(sandbox_id)
        if healthy:
            sandbox.healthy_at = now
            sandbox.save(update_fields=["healthy_at", "updated_at"])
        add_events(sandbox, [(events.HEALTHY if healthy else events.HEALTH_FAILED, now, {})])


def sandbox_release(
    *,
    sandbox_id: int,
    now: dt.datetime,
    verdict: str | None = None,
    patch_sha256: str | None = None,
    suite: str | None = None,
) -> Sandbox:
    """In use → released. A second release is ``AlreadyReleased`` (409)."""
    with transaction.atomic():
        return release_locked(
            _lock(sandbox_id), now=now, verdict=verdict, patch_sha256=patch_sha256, suite=suite
        )


def release_locked(
    sandbox: Sandbox,
    *,
    now: dt.datetime,
    verdict: str | None = None,
    patch_sha256: str | None = None,
    suite: str | None = None,
) -> Sandbox:
    """:func:`sandbox_release` for a row the caller locked in its open transaction."""
    refused = release_refusal(sandbox)
    if refused is not None:
        raise refused
    move = release_move(
        sandbox_id=sandbox.pk, now=now, verdict=verdict, patch_sha256=patch_sha256, suite=suite
    )
    return apply_locked(sandbox, move)


def release_refusal(sandbox: Sandbox) -> SandmanError | None:
    """Why this row cannot be released (lost by its backend: ``SandboxLost``; released
    before: ``AlreadyReleased``, a 409; not in use: ``InvalidTransition``), or None."""
    if sandbox.failure_reason.startswith(LOST_PREFIX):
        return SandboxLost(
            f"sandbox {sandbox.name} was lost by its backend: "
            f"{sandbox.failure_reason[len(LOST_PREFIX) :]}",
            {"state": sandbox.state, "failure_reason": sandbox.failure_reason},
        )
    if sandbox.state == SandboxState.IN_USE:
        return None
    if sandbox.released_at is not None or sandbox.state in (
        SandboxState.RELEASED,
        SandboxState.DELETING,
        SandboxState.DELETED,
    ):
        return AlreadyReleased(
            f"sandbox {sandbox.name} was already released (state {sandbox.state})"
        )
    return InvalidTransition(
        f"sandbox {sandbox.name} is {sandbox.state}, not in use: nothing to release"
    )


def sandbox_return_for_reuse(
    *, sandbox_id: int, verdicts: dict[str, str], now: dt.datetime
) -> Sandbox:
    """Released → ready after a passed state check (checked reuse of grading pods)."""
    with transaction.atomic():
        sandbox = _lock(sandbox_id)
        return sandbox_transition(
            sandbox_id=sandbox_id,
            to=SandboxState.READY,
            now=now,
            fields={
                "reuse_count": sandbox.reuse_count + 1,
                "reuse_verdicts": verdicts,
                "ready_at": now,
            },
            reason="checked_reuse",
        )


def sandbox_fail(
    *,
    sandbox_id: int,
    reason: str,
    now: dt.datetime,
    kind: str = events.CREATE_ERROR,
    detail: dict[str, Any] | None = None,
) -> Sandbox:
    """Any live state → failed, with the reason and one event of ``kind``."""
    return sandbox_transition(
        sandbox_id=sandbox_id,
        to=SandboxState.FAILED,
        now=now,
        fields={"failure_reason": reason[:2000]},
        extra_events=[(kind, now, {"error": reason[:500], **(detail or {})})],
        reason=reason[:200],
    )


def sandbox_mark_lost(
    *, name: str, uid: str, reason: str, message: str, backend: str, now: dt.datetime
) -> tuple[int, int, str] | None:
    """The backend lost a Ready, in-use or released sandbox: failed, with the reason its
    holder reads (GET shows it, a release answers ``SandboxLost``) and a ``lost`` event.

    Returns (sandbox id, job id, the state it was in), or None when no such row is in one
    of those states (being created: its wait fails by itself; being deleted: ours).
    """
    with transaction.atomic():
        sandbox = (
            Sandbox.objects.select_for_update()
            .filter(name=name, backend=backend, state__in=_LOSABLE)
            .first()
        )
        if sandbox is None or (uid and sandbox.backend_uid and sandbox.backend_uid != uid):
            return None
        before = sandbox.state
        text = f"{LOST_PREFIX}{reason}: {message}" if message else f"{LOST_PREFIX}{reason}"
        sandbox_fail(
            sandbox_id=sandbox.pk,
            reason=text,
            now=now,
            kind=events.LOST,
            detail={"reason": reason, "message": message[:500]},
        )
        return sandbox.pk, sandbox.job_id, before


def sandbox_mark_gone(*, sandbox_id: int, reason: str, now: dt.datetime) -> Sandbox | None:
    """The backend holds nothing under this name (reconcile): end the row as deleted.

    A row that was never sent (``requested``) or was being deleted goes straight to
    ``deleted``; any other live state passes through ``failed`` with ``reason``.
    """
    with transaction.atomic():
        sandbox = _lock(sandbox_id)
        if sandbox.state == SandboxState.DELETED:
            return None
        if SandboxState.DELETED not in SANDBOX_TRANSITIONS[sandbox.state]:
            sandbox_fail(sandbox_id=sandbox_id, reason=reason, now=now, kind=events.BACKEND_GONE)
        return sandbox_transition(
            sandbox_id=sandbox_id,
            to=SandboxState.DELETED,
            now=now,
            extra_events=[(events.DELETED, now, {"reason": reason})],
            reason=reason,
        )


def sandbox_record_event(
    *, sandbox_id: int, kind: str, now: dt.datetime, detail: dict[str, Any] | None = None
) -> None:
    """An event without a state change (reclaim notice, pod cap, late pod kept)."""
    with transaction.atomic():
        sandbox = Sandbox.objects.filter(pk=sandbox_id).first()
        if sandbox is None:
            raise NotFound(f"sandbox {sandbox_id} does not exist")
        add_events(sandbox, [(kind, now, dict(detail or {}))])
        publish_on_commit("sandbox.event", payload(sandbox, kind=kind, at=now))
