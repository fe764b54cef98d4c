"""Deletes that survive restarts: the move to ``deleting`` and its PendingDelete row.

Invariants a reader must not break (paper §4.4, Appendix F, Table 2 row 3):
* The ``PendingDelete`` row is written in the SAME transaction that moves the sandbox to
  ``deleting``; the controller sends the delete only after that commit. A crash between
  the two leaves a pending delete that the next start resumes.
* The row is removed only when the backend confirms the sandbox gone
  (:func:`pending_delete_confirmed`); a failure only reschedules it with backoff
  (1 s doubling to 30 s), so every delete is retried until confirmed.
* A sandbox still ``requested`` was never sent to the backend: it is ended at once as
  ``deleted`` with no backend call.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import transaction

from sandboxes import events
from sandboxes.models import PendingDelete, Sandbox, SandboxEvent
from sandboxes.services.sandboxes import sandbox_transition
from sandboxes.states import SANDBOX_TRANSITIONS, SandboxState


@dataclass(frozen=True)
class DeleteOrder:
    """What the controller needs to call ``provider.destroy`` for one sandbox."""

    name: str
    nonce: str
    backend: str
    uid: str
    ref: str
    sandbox_id: int | None
    attempts: int = 0


def delete_backoff_s(attempts: int) -> float:
    """Seconds before retry number ``attempts`` + 1: 1, 2, 4, 8, 16, then 30."""
    return float(min(30, 2 ** max(0, attempts - 1)))


def pending_order(pending: PendingDelete) -> DeleteOrder:
    """The order to send for one pending delete row."""
    return DeleteOrder(
        name=pending.name,
        nonce=pending.nonce,
        backend=pending.backend,
        uid=pending.backend_uid,
        ref=pending.backend_ref,
        sandbox_id=pending.sandbox_id,
        attempts=pending.attempts,
    )


def pending_delete_for_unknown(
    *,
    name: str,
    backend: str,
    uid: str,
    nonce: str,
    ref: str,
    reason: str,
    now: dt.datetime,
) -> DeleteOrder:
    """Persist a delete of a backend sandbox no row owns (reconcile, sweep)."""
    with transaction.atomic():
        pending, _ = PendingDelete.objects.get_or_create(
            name=name,
            defaults={
                "backend": backend,
                "backend_uid": uid[:64],
                "backend_ref": ref[:512],
                "nonce": nonce[:64],
                "sandbox": None,
                "reason": reason[:64],
                "created_at": now,
                "next_attempt_at": now,
            },
        )
        return pending_order(pending)


def pending_delete_confirmed(*, name: str, now: dt.datetime) -> int | None:
    """The backend confirmed ``name`` gone: drop the pending row, end the sandbox row.

    Returns the sandbox id that was ended, if any. Idempotent.
    """
    with transaction.atomic():
        PendingDelete.objects.filter(name=name).delete()
        sandbox = Sandbox.objects.select_for_update().filter(name=name).first()
        if sandbox is None or sandbox.state == SandboxState.DELETED:
            return None
        if sandbox.state != SandboxState.DELETING:
            # Confirmed gone while the row still said otherwise (e.g. reconcile): pass
            # through deleting so the timeline stays a legal path.
            if SandboxState.DELETED not in SANDBOX_TRANSITIONS[sandbox.state]:
                sandbox_transition(sandbox_id=sandbox.pk, to=SandboxState.DELETING, now=now)
        sandbox_transition(
            sandbox_id=sandbox.pk,
            to=SandboxState.DELETED,
            now=now,
            extra_events=[(events.DELETED, now, {})],
        )
        return sandbox.pk


def pending_delete_failed(*, name: str, error: str, now: dt.datetime) -> DeleteOrder | None:
    """A delete attempt failed: count it, keep the error, schedule the next try."""
    with transaction.atomic():
        pending = PendingDelete.objects.select_for_update().filter(name=name).first()
        if pending is None:
            return None
        pending.attempts += 1
        pending.last_error = error[:2000]
        pending.next_attempt_at = now + dt.timedelta(seconds=delete_backoff_s(pending.attempts))
        pending.save(update_fields=["attempts", "last_error", "next_attempt_at"])
        if pending.sandbox_id is not None:
            SandboxEvent.objects.create(
                sandbox_id=pending.sandbox_id,
                kind=events.DELETE_FAILED,
                at=now,
                detail={"error": error[:500], "attempts": pending.attempts},
            )
        return pending_order(pending)
