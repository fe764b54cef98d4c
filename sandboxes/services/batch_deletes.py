"""Deletes of many sandboxes in one transaction (the controller's batch of ``deletes.py``).

The same rules as :func:`sandbox_begin_delete` (one request of the batch) and
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

from sandboxes import events
from sandboxes.models import PendingDelete, Sandbox
from sandboxes.services.batch import apply_moves_locked, batch_atomic, lock_rows_by_pk
from sandboxes.services.deletes import DeleteOrder, pending_order
from sandboxes.services.moves import Event, SandboxMove, release_move
from sandboxes.services.rawinsert import insert_new_rows_skipping
from sandboxes.services.sandboxes import release_refusal
from sandboxes.states import SANDBOX_TRANSITIONS, Role, SandboxState
from sandman_site.errors import AlreadyReleased, NotFound, SandmanError


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
    with batch_atomic():
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
        orders = _pending_orders(locked, [r for _, r in needs])
        for index, r in needs:
            out[index] = orders[r.sandbox_id]
        return out


def pending_delete_confirmed_many(
    *, names: Sequence[str], now: dt.datetime
) -> list[int | None | SandmanError]:
    """The backend confirmed these names gone: drop their pending rows, end their sandboxes.

    Per name the sandbox id that was ended, or None (no row, or already deleted)."""
    with batch_atomic():
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


def _pending_orders(
    locked: dict[int, Sandbox], requests: Sequence[DeleteRequest]
) -> dict[int, DeleteOrder]:
    """The order of each request's sandbox (by sandbox id): its ``PendingDelete`` row, kept
    if one exists, else inserted, in the caller's transaction. The new rows go in ONE
    INSERT that skips a name already pending (``insert_new_rows_skipping``); only the
    names it skipped (a delete begun again: rare) are read back."""
    fresh: dict[str, PendingDelete] = {}
    for r in requests:
        row = locked[r.sandbox_id]
        if row.name in fresh:
            continue
        fresh[row.name] = pending_row(row, r)
    inserted = insert_new_rows_skipping(PendingDelete, list(fresh.values()), unique="name")
    kept = set(fresh) - inserted
    pending = {name: fresh[name] for name in inserted}
    if kept:
        pending.update({p.name: p for p in PendingDelete.objects.filter(name__in=kept)})
    return {r.sandbox_id: pending_order(pending[locked[r.sandbox_id].name]) for r in requests}


@dataclass(frozen=True)
class ReleaseRequest:
    """``sandbox_release_and_begin_delete``'s arguments."""

    sandbox_id: int
    now: dt.datetime
    verdict: str | None = None
    patch_sha256: str | None = None
    suite: str | None = None
    keep_grading: bool = False  # a grading pod is kept (released, no delete) for reuse


Released = tuple[Sandbox, DeleteOrder | None, bool]  # the row, its order, kept for reuse


def sandbox_release_many(*, requests: Sequence[ReleaseRequest]) -> list[Released | SandmanError]:
    """Many releases, each with its delete begun (or its grading pod kept for a reuse
    check), in ONE transaction: one lock of all rows, the moves applied as one batch, the
    pending rows in one INSERT. Per request ``(row, order, kept)`` or the error that
    refused it (``release_refusal``; a second release of a sandbox is ``AlreadyReleased``,
    in the same batch too), which writes nothing for it."""
    with batch_atomic():
        locked = lock_rows_by_pk({r.sandbox_id for r in requests})
        out: list[Released | SandmanError | None] = []
        moves: list[SandboxMove] = []
        planned: list[tuple[int, ReleaseRequest, DeleteRequest | None]] = []
        released: set[int] = set()
        for r in requests:
            row = locked.get(r.sandbox_id)
            if row is None:
                out.append(NotFound(f"sandbox {r.sandbox_id} does not exist"))
                continue
            refused = release_refusal(row)
            if refused is None and r.sandbox_id in released:
                refused = AlreadyReleased(f"sandbox {row.name} was already released")
            if refused is not None:
                out.append(refused)
                continue
            released.add(r.sandbox_id)
            release, delete = release_plan(row, r)
            moves.extend(release)
            planned.append((len(out), r, delete))
            out.append(None)
        for answer in apply_moves_locked(locked, moves):
            if isinstance(answer, SandmanError):  # in use -> released -> deleting is allowed
                raise answer
        orders = _pending_orders(locked, [d for _, _, d in planned if d is not None])
        for index, r, delete in planned:
            order = None if delete is None else orders[r.sandbox_id]
            out[index] = (locked[r.sandbox_id], order, delete is None)
    return [answer for answer in out if answer is not None]


def release_plan(row: Sandbox, r: ReleaseRequest) -> tuple[list[SandboxMove], DeleteRequest | None]:
    """The moves of one release of a row that may be released (``release_refusal``): in
    use -> released, then, unless a grading pod is kept for a reuse check, -> deleting with
    the delete it begins (its order's ``PendingDelete`` is the caller's to write)."""
    moves = [
        release_move(
            sandbox_id=row.pk,
            now=r.now,
            verdict=r.verdict,
            patch_sha256=r.patch_sha256,
            suite=r.suite,
        )
    ]
    if r.keep_grading and row.role == Role.GRADING:
        return moves, None
    delete = DeleteRequest(sandbox_id=row.pk, reason="released", now=r.now)
    begin, _ = _begin_moves(row, delete)  # in use: to deleting, with an order
    return [*moves, *begin], delete


def pending_row(row: Sandbox, r: DeleteRequest) -> PendingDelete:
    """The ``PendingDelete`` a delete of ``row`` persists (not saved here)."""
    return PendingDelete(
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


def sandbox_release_and_begin_delete(
    *,
    sandbox_id: int,
    now: dt.datetime,
    verdict: str | None = None,
    patch_sha256: str | None = None,
    suite: str | None = None,
    keep_grading: bool = False,
) -> tuple[Sandbox, DeleteOrder | None, bool]:
    """Release, then (unless kept for a reuse check) begin the delete: ONE transaction.

    Returns ``(sandbox, order, kept)``; ``kept`` is True when ``keep_grading`` asked to
    keep a grading pod for checked reuse and the sandbox is one. One release of
    :func:`sandbox_release_many` (the controller
    batches them).
    """
    request = ReleaseRequest(
        sandbox_id=sandbox_id,
        now=now,
        verdict=verdict,
        patch_sha256=patch_sha256,
        suite=suite,
        keep_grading=keep_grading,
    )
    (answer,) = sandbox_release_many(requests=[request])
    if isinstance(answer, Exception):
        raise answer
    return answer


def sandbox_begin_delete(
    *, sandbox_id: int, reason: str, now: dt.datetime, kind: str = ""
) -> DeleteOrder | None:
    """Move a sandbox to ``deleting`` and persist its pending delete, in one transaction.

    Returns the order to send, or None when there is nothing to delete on the backend
    (already deleted, never sent, or no such sandbox). ``kind`` adds one more event (e.g.
    ``reclaimed``). One request of :func:`sandbox_begin_delete_many`.
    """
    request = DeleteRequest(sandbox_id=sandbox_id, reason=reason, now=now, kind=kind)
    (answer,) = sandbox_begin_delete_many(requests=[request])
    if isinstance(answer, Exception):
        raise answer
    return answer
