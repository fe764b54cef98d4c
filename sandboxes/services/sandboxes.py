"""Sandbox writes: the row before the create, every state change, and its timeline.

Ordering rules a reader must not break (paper §4.4, Appendix F):
* ``sandbox_request`` writes the row (state ``requested``, name, nonce, token) BEFORE the
  controller sends the create, so a restart can always find what the backend may hold.
* Every state change goes through :func:`sandbox_transition`: it locks the row, refuses
  moves not in ``SANDBOX_TRANSITIONS`` (``InvalidTransition``), stamps the state's time
  field, saves with ``update_fields`` and records a ``state`` event in one transaction.
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
from sandboxes.states import SANDBOX_TRANSITIONS, SandboxState
from sandman_site.errors import AlreadyReleased, InvalidTransition, NotFound, SandboxLost

# failure_reason of a sandbox the backend lost while Ready or handed out.
LOST_PREFIX = "lost: "
_LOSABLE = (SandboxState.READY, SandboxState.IN_USE, SandboxState.RELEASED)

# The time field each state stamps when entered.
_STATE_STAMP: dict[str, str] = {
    SandboxState.READY: "ready_at",
    SandboxState.IN_USE: "acquired_at",
    SandboxState.RELEASED: "released_at",
    SandboxState.DELETING: "deleting_at",
    SandboxState.DELETED: "deleted_at",
}
# ReadyInfo.timeline names → (model field, event kind).
_TIMELINE = {
    "api_created": ("api_created_at", events.API_CREATED),
    "scheduled": ("scheduled_at", events.SCHEDULED),
    "address_assigned": ("address_assigned_at", events.ADDRESS_ASSIGNED),
    "image_pulled": ("image_pulled_at", events.IMAGE_PULLED),
    "started": ("started_at", events.STARTED),
    "ready": ("ready_at", events.READY),
}

Event = tuple[str, dt.datetime, dict[str, Any]]


def new_sandbox_name(job_id: int) -> str:
    """A DNS-1123 label, unique with overwhelming probability: ``sm-<job>-<12 hex>``."""
    return f"sm-{job_id}-{secrets.token_hex(6)}"


def _payload(sandbox: Sandbox, **extra: Any) -> dict[str, Any]:
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


def _add_events(sandbox: Sandbox, items: Iterable[Event]) -> None:
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
        _add_events(sandbox, [(events.STATE, now, {"from": "", "to": SandboxState.REQUESTED})])
        publish_on_commit("sandbox.state", _payload(sandbox, previous="", at=now))
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
    previous = sandbox.state
    if to not in SANDBOX_TRANSITIONS[previous]:
        raise InvalidTransition(
            f"sandbox {sandbox.name} cannot go from {previous} to {to}",
            {"from": previous, "to": to},
        )
    sandbox.state = to
    changed = {"state", "updated_at"}
    stamp = _STATE_STAMP.get(to)
    if stamp and not (fields and stamp in fields):
        setattr(sandbox, stamp, now)
        changed.add(stamp)
    for name, value in (fields or {}).items():
        setattr(sandbox, name, value)
        changed.add(name)
    sandbox.save(update_fields=sorted(changed))
    detail: dict[str, Any] = {"from": previous, "to": to}
    if reason:
        detail["reason"] = reason
    _add_events(sandbox, [(events.STATE, now, detail), *extra_events])
    publish_on_commit("sandbox.state", _payload(sandbox, previous=previous, at=now))
    return sandbox


def sandbox_mark_creating(*, sandbox_id: int, now: dt.datetime) -> Sandbox:
    """The create is about to be sent (after the pacer and a creating slot)."""
    return sandbox_transition(
        sandbox_id=sandbox_id,
        to=SandboxState.CREATING,
        now=now,
        extra_events=[(events.CREATE_SENT, now, {})],
    )


def sandbox_record_handle(
    *, sandbox_id: int, uid: str, ref: str, api_created_at: dt.datetime, now: dt.datetime
) -> None:
    """The backend stored the create: keep its identity (for deletes after a restart)."""
    with transaction.atomic():
        sandbox = _lock(sandbox_id)
        sandbox.backend_uid = uid[:64]
        sandbox.backend_ref = ref[:512]
        sandbox.api_created_at = api_created_at
        sandbox.save(update_fields=["backend_uid", "backend_ref", "api_created_at", "updated_at"])
        _add_events(sandbox, [(events.API_CREATED, api_created_at, {"uid": uid})])


def sandbox_mark_ready(*, sandbox_id: int, info: ReadyInfo, now: dt.datetime) -> Sandbox:
    """Ready: record the address and every time the backend reported."""
    fields: dict[str, Any] = {
        "address": info.address,
        "node": info.node,
        "guards": dict(info.guards),
        "image_present": info.image_present,
        "pull_ms": info.pull_ms,
        "address_failures": info.address_failures,
    }
    timeline: list[Event] = []
    for name, at in sorted(info.timeline.items(), key=lambda kv: kv[1]):
        mapped = _TIMELINE.get(name)
        if mapped is None:
            continue
        field, kind = mapped
        if name == "api_created":
            continue  # stamped by sandbox_record_handle when the create returned
        if name == "image_pulled" and info.image_present:
            kind = events.IMAGE_PRESENT
        fields[field] = at
        timeline.append((kind, at, {}))
    fields.setdefault("ready_at", now)
    if not any(kind == events.READY for kind, _, _ in timeline):
        timeline.append((events.READY, fields["ready_at"], {}))
    if info.address_failures:
        timeline.append(
            (events.ADDRESS_FAILURE, now, {"node": info.node, "count": info.address_failures})
        )
    return sandbox_transition(
        sandbox_id=sandbox_id, to=SandboxState.READY, now=now, fields=fields, extra_events=timeline
    )


def sandbox_mark_healthy(*, sandbox_id: int, now: dt.datetime, healthy: bool) -> None:
    """Record one health check (before a warm hand-out)."""
    with transaction.atomic():
        sandbox = _lock(sandbox_id)
        if healthy:
            sandbox.healthy_at = now
            sandbox.save(update_fields=["healthy_at", "updated_at"])
        _add_events(sandbox, [(events.HEALTHY if healthy else events.HEALTH_FAILED, now, {})])


def sandbox_hand_out(
    *,
    sandbox_id: int,
    source: str,
    role: str,
    now: dt.datetime,
    healthy_at: dt.datetime | None = None,
    acquisition: dict[str, Any] | None = None,
) -> Sandbox:
    """Ready → in use: the agent has it now; it is never warm again.

    ``healthy_at`` stamps the health check that preceded a warm hand-out, and
    ``acquisition`` (the fields of ``acquisition_record``) writes the finished
    acquisition, both in the same transaction: one commit per warm hand-out.
    """
    fields: dict[str, Any] = {"source": source, "role": role, "agent_used": True}
    extra: list[Event] = []
    if healthy_at is not None:
        fields["healthy_at"] = healthy_at
        extra.append((events.HEALTHY, healthy_at, {}))
    with transaction.atomic():
        sandbox = transition_locked(
            _lock(sandbox_id),
            to=SandboxState.IN_USE,
            now=now,
            fields=fields,
            extra_events=[*extra, (events.ACQUIRED, now, {"source": source})],
        )
        if acquisition is not None:
            from sandboxes.services.acquisitions import acquisition_insert

            acquisition_insert(**acquisition, sandbox_id=sandbox_id, source=source, now=now)
    return sandbox


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
    if sandbox.failure_reason.startswith(LOST_PREFIX):
        raise SandboxLost(
            f"sandbox {sandbox.name} was lost by its backend: "
            f"{sandbox.failure_reason[len(LOST_PREFIX) :]}",
            {"state": sandbox.state, "failure_reason": sandbox.failure_reason},
        )
    if sandbox.state != SandboxState.IN_USE:
        if sandbox.released_at is not None or sandbox.state in (
            SandboxState.RELEASED,
            SandboxState.DELETING,
            SandboxState.DELETED,
        ):
            raise AlreadyReleased(
                f"sandbox {sandbox.name} was already released (state {sandbox.state})"
            )
        raise InvalidTransition(
            f"sandbox {sandbox.name} is {sandbox.state}, not in use: nothing to release"
        )
    detail: dict[str, Any] = {}
    if verdict:
        detail = {"verdict": verdict, "patch_sha256": patch_sha256 or "", "suite": suite or ""}
    return transition_locked(
        sandbox,
        to=SandboxState.RELEASED,
        now=now,
        extra_events=[(events.RELEASED, now, detail)],
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
        _add_events(sandbox, [(kind, now, dict(detail or {}))])
        publish_on_commit("sandbox.event", _payload(sandbox, kind=kind, at=now))
