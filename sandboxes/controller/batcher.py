"""Coalesce the controller's per-sandbox writes into batches (``services/batch.py``).

Every create makes four writes (its row, ``creating``, the handle with ``ready``, the
hand-out), its acquire two more (the acquisition opened, then finished), and its delete two
(``deleting`` with its pending row, then the confirmation); a warm acquire two (opened, then
the hand-out that finishes it) and a release one (released, with its delete begun). One
at a time each costs a lock, a save, an events insert and a commit on the database
executor: under a 600-pod burst that was half of the controller's CPU
(``bench/results/profile_before.txt``). The :class:`WriteBatcher` queues them instead and
hands everything queued to ONE executor call and ONE transaction per batch, whatever their
kinds: each kind's writes go to its one service call (one query of each kind), with no
savepoint unless a kind raises (``apply_groups``).

Rules a reader must not break:
* Batches form by themselves, with no timer: a lane (one per priority) has at most ONE
  batch on the executor; whatever queues while it runs is the next batch. A lone write under
  no load goes at once, as before; under load the batches grow with the load.
* Priorities as the executor's: an urgent write (a caller waits) never queues behind a
  background batch -- it has its own lane, sent at ``URGENT``.
* A write whose waiter was cancelled before its batch left is dropped from it, as the
  executor skips a cancelled call (a create cancelled before ``creating`` sends nothing).
* Each write is answered with its own outcome: a refused move raises ITS error in its
  waiter; the others of the batch commit. A kind's service call that raises fails that
  kind's writes only (the batch runs again, each kind in a savepoint); a failed commit
  fails the whole batch.
* Writes of one kind keep their order in a batch; kinds go in the order they first queued.
  A write is queued only once the writes it depends on returned (a create awaits each), so
  no write of a batch depends on another of the same batch being applied first.
* Loop thread only.
* ``close()`` (the controller's shutdown, after its tasks were cancelled) waits for the
  batches already on the executor and for what is still queued behind them, so no batch is
  in flight, and no flush task is left pending, once the loop stops; a write submitted after
  it is refused (``ControllerUnavailable``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, transaction

from sandboxes.controller.dbexec import BACKGROUND, URGENT
from sandboxes.controller.state import ControllerState
from sandboxes.models import Sandbox
from sandboxes.services.acquisitions import acquisition_open_many
from sandboxes.services.batch import (
    HandOut,
    SandboxRequest,
    acquisition_record_many,
    sandbox_events_record_many,
    sandbox_hand_out_many,
    sandbox_moves_apply,
    sandbox_request_many,
)
from sandboxes.services.batch_deletes import (
    DeleteRequest,
    Released,
    ReleaseRequest,
    pending_delete_confirmed_many,
    sandbox_begin_delete_many,
    sandbox_release_many,
)
from sandboxes.services.deletes import DeleteOrder
from sandboxes.services.moves import SandboxMove
from sandman_site.errors import ControllerUnavailable, SandmanError

MAX_BATCH = 500


Apply = Callable[[Sequence[Any]], list[Any]]


@dataclass
class _Lane:
    priority: int
    pending: list[tuple[Apply, Any, asyncio.Future[Any]]] = field(default_factory=list)
    busy: bool = False


class WriteBatcher:
    """Queues sandbox rows and moves; one batch in flight per lane (one lane per priority)."""

    def __init__(self, state: ControllerState, *, max_batch: int = MAX_BATCH) -> None:
        self._state = state
        self._max = max(1, max_batch)
        self._lanes: dict[bool, _Lane] = {}
        self._flushes: set[asyncio.Task[None]] = set()
        self._closed = False
        self.batches = 0
        self.writes = 0
        self.largest = 0

    async def request(self, request: SandboxRequest, *, urgent: bool = False) -> Sandbox:
        """The ``requested`` row of one create (its pk set)."""
        row: Sandbox = await self._submit(request, urgent, _apply_requests)
        return row

    async def move(self, move: SandboxMove, *, urgent: bool = False) -> Sandbox:
        """Apply one move; its refusal (``InvalidTransition``, ``NotFound``) is raised here."""
        row: Sandbox = await self._submit(move, urgent, _apply_moves)
        return row

    async def hand_out(self, item: HandOut, *, urgent: bool = True) -> Sandbox:
        """One hand-out with its finished acquisition (a warm one); its refusal is raised."""
        row: Sandbox = await self._submit(item, urgent, _apply_hand_outs)
        return row

    async def release(self, request: ReleaseRequest, *, urgent: bool = True) -> Released:
        """One release with its delete begun: ``(row, order, kept)``; its refusal raised."""
        answer: Released = await self._submit(request, urgent, _apply_releases)
        return answer

    async def open_acquisition(self, record: dict[str, Any]) -> int:
        """Open one ``pending`` acquisition row (a caller waits: urgent); its id."""
        row = await self._submit(record, True, _apply_open_acquisitions)
        pk: int = row.pk
        return pk

    async def acquisition(self, record: dict[str, Any], *, urgent: bool = False) -> None:
        """One finished acquisition (``acquisition_record``'s keyword arguments)."""
        await self._submit(record, urgent, _apply_acquisitions)

    async def event(
        self, sandbox_id: int, kind: str, now: Any, detail: dict[str, Any] | None = None
    ) -> None:
        """``sandbox_record_event`` (an event without a state change); ``NotFound`` raised
        here when the sandbox does not exist."""
        await self._submit((sandbox_id, kind, now, detail), False, _apply_events)

    async def begin_delete(self, request: DeleteRequest) -> DeleteOrder | None:
        """``sandbox_begin_delete``: the order to send, or None (nothing on the backend)."""
        order: DeleteOrder | None = await self._submit(request, False, _apply_begin_deletes)
        return order

    async def confirm_deleted(self, name: str) -> int | None:
        """``pending_delete_confirmed``: the sandbox id ended, if any."""
        ended: int | None = await self._submit((name, self._state.now()), False, _apply_confirmed)
        return ended

    async def close(self, timeout: float = 15.0) -> None:
        """Refuse new writes; let every lane send what it holds (a write whose waiter was
        cancelled is dropped as always). Flushes still running after ``timeout`` seconds are
        cancelled, and with them their waiters."""
        self._closed = True
        flushes = list(self._flushes)
        if not flushes:
            return
        _, late = await asyncio.wait(flushes, timeout=timeout)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)

    async def _submit(self, item: Any, urgent: bool, apply: Apply) -> Any:
        if self._closed:
            raise ControllerUnavailable("the controller is stopping")
        lane = self._lanes.get(urgent)
        if lane is None:
            lane = self._lanes[urgent] = _Lane(URGENT if urgent else BACKGROUND)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        lane.pending.append((apply, item, fut))
        if not lane.busy:
            lane.busy = True
            task = asyncio.get_running_loop().create_task(self._flush(lane))
            self._flushes.add(task)
            task.add_done_callback(self._flushes.discard)
        return await fut

    async def _flush(self, lane: _Lane) -> None:
        """Send the lane's queue, batch after batch, until it is empty."""
        try:
            while lane.pending:
                taken = [(a, i, f) for a, i, f in lane.pending[: self._max] if not f.done()]
                del lane.pending[: self._max]
                if not taken:
                    continue
                self.batches += 1
                self.writes += len(taken)
                self.largest = max(self.largest, len(taken))
                groups: dict[Apply, list[Any]] = {}
                for apply, item, _ in taken:
                    groups.setdefault(apply, []).append(item)
                try:
                    answers = await self._state.db.run(
                        apply_groups, list(groups.items()), priority=lane.priority
                    )
                except asyncio.CancelledError:  # shutdown: nobody settles these any more
                    for _, _, fut in taken:
                        fut.cancel()
                    raise
                except Exception as exc:  # the whole batch failed (database gone)
                    for _, _, fut in taken:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                outcomes = {apply: iter(answer) for apply, answer in answers.items()}
                for apply, _, fut in taken:
                    outcome = next(outcomes[apply])
                    if fut.done():
                        continue
                    if isinstance(outcome, BaseException):
                        fut.set_exception(outcome)
                    else:
                        fut.set_result(outcome)
        finally:
            lane.busy = False
            for _, _, fut in lane.pending:  # only if cancelled mid-way (shutdown)
                if not fut.done():
                    fut.cancel()
            if lane.pending:
                lane.pending.clear()


def apply_groups(groups: list[tuple[Apply, list[Any]]]) -> dict[Apply, list[Any]]:
    """Database thread: every kind's writes of one batch in ONE transaction. A lone kind is
    its own service call (its own transaction, as before). With several, they run one after
    the other with no savepoint (a batch service opens none inside another transaction:
    ``services.batch.batch_atomic``); if one raises, nothing of the batch was committed and
    the batch runs again with each kind in a savepoint, so the one that raises answers its
    writes with that error and the rest commit. A failed commit fails the whole batch."""
    if len(groups) == 1:
        ((apply, items),) = groups
        return {apply: _checked(apply, items)}
    kind_raised = False
    try:
        with transaction.atomic():
            out: dict[Apply, list[Any]] = {}
            for apply, items in groups:
                try:
                    out[apply] = _checked(apply, items)
                except (SandmanError, DatabaseError):
                    kind_raised = True
                    raise
            return out
    except (SandmanError, DatabaseError):
        if not kind_raised:
            raise  # the commit itself failed
    out = {}
    with transaction.atomic():
        for apply, items in groups:
            try:
                with transaction.atomic():  # a savepoint: a raise undoes this kind alone
                    out[apply] = _checked(apply, items)
            except (SandmanError, DatabaseError) as exc:
                out[apply] = [exc] * len(items)
    return out


def _checked(apply: Apply, items: list[Any]) -> list[Any]:
    answer = apply(items)
    if len(answer) != len(items):
        raise RuntimeError(f"{apply.__name__} answered {len(answer)} of {len(items)} writes")
    return answer


def _apply_requests(items: Sequence[SandboxRequest]) -> list[Any]:
    return list(sandbox_request_many(requests=items))


def _apply_moves(items: Sequence[SandboxMove]) -> list[Any]:
    return list(sandbox_moves_apply(moves=items))


def _apply_hand_outs(items: Sequence[HandOut]) -> list[Any]:
    return list(sandbox_hand_out_many(items=items))


def _apply_releases(items: Sequence[ReleaseRequest]) -> list[Any]:
    return list(sandbox_release_many(requests=items))


def _apply_open_acquisitions(items: Sequence[dict[str, Any]]) -> list[Any]:
    return list(acquisition_open_many(records=items))


def _apply_acquisitions(items: Sequence[dict[str, Any]]) -> list[Any]:
    return list(acquisition_record_many(records=items))


def _apply_events(items: Sequence[tuple[int, str, Any, dict[str, Any] | None]]) -> list[Any]:
    return list(sandbox_events_record_many(items=items))


def _apply_begin_deletes(items: Sequence[DeleteRequest]) -> list[Any]:
    return list(sandbox_begin_delete_many(requests=items))


def _apply_confirmed(items: Sequence[tuple[str, Any]]) -> list[Any]:
    now = max(at for _, at in items)
    return list(pending_delete_confirmed_many(names=[name for name, _ in items], now=now))
