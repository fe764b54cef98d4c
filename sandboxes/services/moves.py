"""One sandbox write as data: a :class:`SandboxMove`, and the moves a create makes.

A move is a state change (or none), the fields it sets and the events it records, for one
sandbox. :func:`plan_move` applies one to a row the caller LOCKED in its open transaction
and answers what to save -- it neither saves nor inserts -- so the single-row services
(``sandboxes.py``) and the batch (``batch.py``: one SELECT ... FOR UPDATE, one bulk UPDATE
and one bulk INSERT of events for many sandboxes) share the exact same rules:

* ``to`` must be allowed from the row's state (``SANDBOX_TRANSITIONS``), else
  ``InvalidTransition`` and the row is left as it was;
* entering a state stamps its time field (``STATE_STAMP``) unless the move sets it;
* a state change records one ``state`` event first, then the move's own events (events a
  folded move carried, ``before``, come ahead of the ``state`` event: :func:`folded`);
* times the backend reported (``ReadyInfo.timeline``) are stamped as reported.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sandboxes import events
from sandboxes.models import Sandbox
from sandboxes.providers.base import ReadyInfo
from sandboxes.states import SANDBOX_TRANSITIONS, SandboxState
from sandman_site.errors import InvalidTransition

Event = tuple[str, dt.datetime, dict[str, Any]]

# The time field each state stamps when entered.
STATE_STAMP: dict[str, str] = {
    SandboxState.READY: "ready_at",
    SandboxState.IN_USE: "acquired_at",
    SandboxState.RELEASED: "released_at",
    SandboxState.DELETING: "deleting_at",
    SandboxState.DELETED: "deleted_at",
}
# ReadyInfo.timeline names → (model field, event kind).
TIMELINE = {
    "api_created": ("api_created_at", events.API_CREATED),
    "scheduled": ("scheduled_at", events.SCHEDULED),
    "address_assigned": ("address_assigned_at", events.ADDRESS_ASSIGNED),
    "image_pulled": ("image_pulled_at", events.IMAGE_PULLED),
    "started": ("started_at", events.STARTED),
    "ready": ("ready_at", events.READY),
}


@dataclass(frozen=True)
class SandboxMove:
    """One write to one sandbox; ``to=None`` changes no state (fields and events only)."""

    sandbox_id: int
    now: dt.datetime
    to: str | None = None
    fields: Mapping[str, Any] = field(default_factory=dict)
    events: tuple[Event, ...] = ()
    reason: str = ""
    publish: bool = True  # a sandbox.state message after commit (state changes only)
    # A hand-out's open acquisition row: it names the sandbox in the same transaction.
    acquisition_id: int | None = None
    # Events recorded BEFORE the state event (what a move folded into this one recorded).
    before: tuple[Event, ...] = ()


@dataclass
class Planned:
    """What :func:`plan_move` changed on the row: fields to save, events, the message."""

    changed: set[str]
    events: list[Event]
    previous: str


def plan_move(sandbox: Sandbox, move: SandboxMove) -> Planned:
    """Apply ``move`` to the locked ``sandbox`` in memory (no query); raise if not allowed."""
    previous = sandbox.state
    changed: set[str] = {"updated_at"}
    recorded: list[Event] = list(move.before)
    if move.to is not None:
        if move.to not in SANDBOX_TRANSITIONS[previous]:
            raise InvalidTransition(
                f"sandbox {sandbox.name} cannot go from {previous} to {move.to}",
                {"from": previous, "to": move.to},
            )
        sandbox.state = move.to
        changed.add("state")
        stamp = STATE_STAMP.get(move.to)
        if stamp and stamp not in move.fields:
            setattr(sandbox, stamp, move.now)
            changed.add(stamp)
        detail: dict[str, Any] = {"from": previous, "to": move.to}
        if move.reason:
            detail["reason"] = move.reason
        recorded.append((events.STATE, move.now, detail))
    for name, value in move.fields.items():
        setattr(sandbox, name, value)
        changed.add(name)
    recorded.extend(move.events)
    return Planned(changed=changed, events=recorded, previous=previous)


# --- the moves of one create ------------------------------------------------------------
def creating_move(*, sandbox_id: int, now: dt.datetime) -> SandboxMove:
    """The create is about to be sent (after the pacer and a creating slot)."""
    return SandboxMove(
        sandbox_id=sandbox_id,
        now=now,
        to=SandboxState.CREATING,
        events=((events.CREATE_SENT, now, {}),),
    )


def handle_move(
    *, sandbox_id: int, uid: str, ref: str, api_created_at: dt.datetime, now: dt.datetime
) -> SandboxMove:
    """The backend stored the create: keep its identity (for deletes after a restart)."""
    return SandboxMove(
        sandbox_id=sandbox_id,
        now=now,
        fields={
            "backend_uid": uid[:64],
            "backend_ref": ref[:512],
            "api_created_at": api_created_at,
        },
        events=((events.API_CREATED, api_created_at, {"uid": uid}),),
        publish=False,
    )


def folded(first: SandboxMove, then: SandboxMove) -> SandboxMove:
    """``first`` (a move with no state change, e.g. :func:`handle_move`) and ``then`` as ONE
    write: ``first``'s fields and events, recorded ahead of ``then``'s state event, as if
    ``first`` had committed just before it. ``then``'s fields win where both set one."""
    if first.to is not None or first.sandbox_id != then.sandbox_id:
        raise ValueError("only a move without a state change folds into one of its sandbox")
    return dataclasses.replace(
        then,
        fields={**first.fields, **then.fields},
        before=first.before + first.events + then.before,
    )


def ready_move(*, sandbox_id: int, info: ReadyInfo, now: dt.datetime) -> SandboxMove:
    """Ready: the address and every time the backend reported."""
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
        mapped = TIMELINE.get(name)
        if mapped is None or name == "api_created":
            continue  # api_created: stamped by the handle move when the create returned
        field_name, kind = mapped
        if name == "image_pulled" and info.image_present:
            kind = events.IMAGE_PRESENT
        fields[field_name] = at
        timeline.append((kind, at, {}))
    fields.setdefault("ready_at", now)
    if not any(kind == events.READY for kind, _, _ in timeline):
        timeline.append((events.READY, fields["ready_at"], {}))
    if info.address_failures:
        timeline.append(
            (events.ADDRESS_FAILURE, now, {"node": info.node, "count": info.address_failures})
        )
    return SandboxMove(
        sandbox_id=sandbox_id,
        now=now,
        to=SandboxState.READY,
        fields=fields,
        events=tuple(timeline),
    )


def hand_out_move(
    *,
    sandbox_id: int,
    source: str,
    role: str,
    now: dt.datetime,
    healthy_at: dt.datetime | None = None,
    acquisition_id: int | None = None,
) -> SandboxMove:
    """Ready → in use: the agent has it now; it is never warm again.

    ``acquisition_id`` (the waiting acquire's ``pending`` row) is linked to the sandbox in
    the transaction that commits the hand-out: a restart that ends the row
    ``service_restarted`` still knows which sandbox it was given (services/recovery.py)."""
    fields: dict[str, Any] = {"source": source, "role": role, "agent_used": True}
    extra: list[Event] = []
    if healthy_at is not None:
        fields["healthy_at"] = healthy_at
        extra.append((events.HEALTHY, healthy_at, {}))
    extra.append((events.ACQUIRED, now, {"source": source}))
    return SandboxMove(
        sandbox_id=sandbox_id,
        now=now,
        to=SandboxState.IN_USE,
        fields=fields,
        events=tuple(extra),
        acquisition_id=acquisition_id,
    )


def release_move(
    *,
    sandbox_id: int,
    now: dt.datetime,
    verdict: str | None = None,
    patch_sha256: str | None = None,
    suite: str | None = None,
) -> SandboxMove:
    """In use → released (the caller checked it may: ``sandboxes.release_refusal``); a
    grading's verdict rides on the ``released`` event."""
    detail: dict[str, Any] = {}
    if verdict:
        detail = {"verdict": verdict, "patch_sha256": patch_sha256 or "", "suite": suite or ""}
    return SandboxMove(
        sandbox_id=sandbox_id,
        now=now,
        to=SandboxState.RELEASED,
        events=((events.RELEASED, now, detail),),
    )
