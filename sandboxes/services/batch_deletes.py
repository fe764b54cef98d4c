"""Deletes of many sandboxes in one transaction (the controller's batch of ``deletes.py``).

The same rules as :func:`~sandboxes.services.deletes.sandbox_begin_delete` and
:func:`~sandboxes.services.deletes.pending_delete_confirmed`, for a batch:

* the ``PendingDelete`` row of each delete is written in the SAME transaction that moves its
  sandbox to ``deleting`` (one lock of all rows, one bulk UPDATE, one INSERT of events, one
  INSERT of pending rows); the controller sends a delete only after that commit;
* a sandbox still ``requested`` was never sent: it ends ``deleted`` with no order;
* a confirmation drops the pending rows and ends every named sandbox ``deleted`` (through
  ``deleting`` when its state needs it); idempotent.

Each item is answered alone: its order / sandbox id / None, or the error that refused it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction

from sandboxes import events
from sandboxes.models import PendingDelete, Sandbox
from sandboxes.services.batch import apply_moves_locked, lock_rows_by_pk
from sandboxes.services.deletes import DeleteOrder, pending_order
from sandboxes.services.moves import Event, SandboxMove
from sandboxes.services.rawinsert import insert_new_rows
from sandboxes.states import SANDBOX_TRANSITIONS, SandboxState
from sandman_site.errors import SandmanError


@dataclass(frozen=True)
class DeleteRequest:
    """``sandbox_begin_delete``'s arguments."""

    sandbox_id: int
    reason: str
    now: dt.datetime
    kind: str = ""


def _begin_moves(row: Sandbox, r: DeleteRequest) -> tuple[list[SandboxMove], bool]:
    """The moves that begin one delete, and whether it needs a pending row (an order)."""
    if row.state == SandboxState.DELETED:
        return [], False
    extra: list[Event] = [(r.kind, r.now, {"reason": r.reason})] if r.kind else []
    if row.state == SandboxState.REQUESTED:
        final = (events.DELETED, r.now, {"reason": r.reason, "sent": False})
        deleted = SandboxMove(
            sandbox_id=row.pk,
            now=r.now,
            to=SandboxState.DELETED,
            events=(*extra, final),
            reason=r.reason,
        )
        return [deleted], False
    if row.state == SandboxState.DELETING:
        return [], True
    sent = (events.DELETE_SENT, r.now, {"reason": r.reason})
    move = SandboxMove(
        sandbox_id=row.pk,
        now=r.now,
        to=SandboxState.DELETING,
        events=(*extra, sent),
        reason=r.reason,
    )
    return [move], True


def sandbox_begin_delete_many(
    *, requests: Sequence[DeleteRequest]
) -> list[DeleteOrder | None | SandmanError]:
    """Begin many deletes in one transaction; per request its order, None, or its error."""
    with transaction.atomic():
        ids = sorted({r.sandbox_id for r in requests})
        locked = lock_rows_by_pk(ids)
        out: list[DeleteOrder | None | SandmanError] = []
        needs: list[tuple[int, DeleteRequest]] = []  # (index in out, request)
        moves: list[SandboxMove] = []
        move_of: dict[int, int] = {}  # index in out -> index in moves
        first: dict[int, int] = {}  # sandbox id -> index in out of its first request
        for r in requests:
            row = locked.get(r.sandbox_id)
            out.append(None)
            if row is None:
                continue
            if r.sandbox_id in first:  # asked twice in one batch: the first one's answer
                earlier = next((q for i, q in needs if i == first[r.sandbox_id]), None)
                if earlier is not None:
                    needs.append((len(out) - 1, earlier))
                continue
            first[r.sandbox_id] = len(out) - 1
            begin, pending = _begin_moves(row, r)
            if begin:
                move_of[len(out) - 1] = len(moves)
                moves.extend(begin)
            if pending:
                needs.append((len(out) - 1, r))
        applied = apply_moves_locked(locked, moves)
        refused = {
            index: applied[m]
            for index, m in move_of.items()
            if isinstance(applied[m], SandmanError)
        }
        for index, exc in refused.items():
            out[index] = exc  # type: ignore[assignment]
        needs = [(i, r) for i, r in needs if i not in refused]
        names = {locked[r.sandbox_id].name for _, r in needs}
        existing = {p.name: p for p in PendingDelete.objects.filter(name__in=names)}
        fresh: dict[str, PendingDelete] = {}
        for _, r in needs:
            row = locked[r.sandbox_id]
            if row.name in existing or row.name in fresh:
                continue
            fresh[row.name] = PendingDelete(
                name=row.name,
                backend=row.backend,
                backend_uid=row.backend_uid,
                backend_ref=row.backend_ref,
                nonce=row.nonce,
                sandbox=row,
                reason=r.reason[:64],
                created_at=r.now,
                next_attempt_at=r.now,
            )
        insert_new_rows(PendingDelete, list(fresh.values()))  # pks are not needed here
        existing.update(fresh)
        for index, r in needs:
            out[index] = pending_order(existing[locked[r.sandbox_id].name])
        return out


def pending_delete_confirmed_many(
    *, names: Sequence[str], now: dt.datetime
) -> list[int | None | SandmanError]:
    """The backend confirmed these names gone: drop their pending rows, end their sandboxes.

    Per name the sandbox id that was ended, or None (no row, or already deleted)."""
    with transaction.atomic():
        PendingDelete.objects.filter(name__in=set(names)).delete()
        rows = {
            s.name: s
            for s in Sandbox.objects.select_for_update().filter(name__in=set(names)).order_by("pk")
        }
        locked = {s.pk: s for s in rows.values()}
        out: list[int | None | SandmanError] = []
        moves: list[SandboxMove] = []
        spans: list[tuple[int, int, int]] = []  # (index in out, first move, end)
        ended: set[str] = set()
        for name in names:
            row = rows.get(name)
            out.append(None)
            if row is None or row.state == SandboxState.DELETED or name in ended:
                continue
            ended.add(name)
            start = len(moves)
            if row.state != SandboxState.DELETING and (
                SandboxState.DELETED not in SANDBOX_TRANSITIONS[row.state]
            ):
                # Gone while the row said otherwise: pass through deleting (a legal path).
                moves.append(SandboxMove(sandbox_id=row.pk, now=now, to=SandboxState.DELETING))
            final: Event = (events.DELETED, now, {})
            moves.append(
                SandboxMove(sandbox_id=row.pk, now=now, to=SandboxState.DELETED, events=(final,))
            )
            spans.append((len(out) - 1, start, len(moves)))
        applied = apply_moves_locked(locked, moves)
        for index, start, end in spans:
            failed = next((x for x in applied[start:end] if isinstance(x, SandmanError)), None)
            out[index] = failed if failed is not None else applied[end - 1].pk  # type: ignore[union-attr]
        return out
