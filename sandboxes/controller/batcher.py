"""Coalesce the controller's per-sandbox writes into batches (``services/batch.py``).

Every create makes five writes (its row, ``creating``, the handle, ``ready``, the
hand-out), its acquire two more (the acquisition opened, then finished), and its delete two
(``deleting`` with its pending row, then the confirmation). One at a time each costs a
lock, a save, an events insert and a commit on the database executor: under a 600-pod
burst that was half of the controller's CPU (``bench/results/profile_before.txt``). The
:class:`WriteBatcher` queues them instead and hands everything queued to ONE service call
per batch.

Rules a reader must not break:
* Batches form by themselves, with no timer: a lane (kind x priority) has at most ONE batch
  on the executor; whatever queues while it runs is the next batch. A lone write under no
  load goes at once, as before; under load the batches grow with the load.
* Priorities as the executor's: an urgent write (a caller waits) never queues behind a
  background batch -- it has its own lane, sent at ``URGENT``.
* A write whose waiter was cancelled before its batch left is dropped from it, as the
  executor skips a cancelled call (a create cancelled before ``creating`` sends nothing).
* Each write is answered with its own outcome: a refused move raises ITS error in its
  waiter; the others of the batch commit.
* Loop thread only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sandboxes.controller.dbexec import BACKGROUND, URGENT
from sandboxes.controller.state import ControllerState
from sandboxes.models import Sandbox
from sandboxes.services.acquisitions import acquisition_open_many
from sandboxes.services.batch import (
    SandboxRequest,
    acquisition_record_many,
    sandbox_moves_apply,
    sandbox_request_many,
)
from sandboxes.services.batch_deletes import (
    DeleteRequest,
    pending_delete_confirmed_many,
    sandbox_begin_delete_many,
)
from sandboxes.services.deletes import DeleteOrder
from sandboxes.services.moves import SandboxMove

MAX_BATCH = 500


@dataclass
class _Lane:
    apply: Callable[..., list[Any]]
    priority: int
    pending: list[tuple[Any, asyncio.Future[Any]]] = field(default_factory=list)
    busy: bool = False


class WriteBatcher:
    """Queues sandbox rows and moves; one batch in flight per lane (kind x priority)."""

    def __init__(self, state: ControllerState, *, max_batch: int = MAX_BATCH) -> None:
        self._state = state
        self._max = max(1, max_batch)
        self._lanes: dict[tuple[str, bool], _Lane] = {}
        self._flushes: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.writes = 0
        self.largest = 0

    async def request(self, request: SandboxRequest, *, urgent: bool = False) -> Sandbox:
        """The ``requested`` row of one create (its pk set)."""
        row: Sandbox = await self._submit("request", request, urgent, _apply_requests)
        return row

    async def move(self, move: SandboxMove, *, urgent: bool = False) -> Sandbox:
        """Apply one move; its refusal (``InvalidTransition``, ``NotFound``) is raised here."""
        row: Sandbox = await self._submit("move", move, urgent, _apply_moves)
        return row

    async def open_acquisition(self, record: dict[str, Any]) -> int:
        """Open one ``pending`` acquisition row (a caller waits: urgent); its id."""
        row = await self._submit("open_acquisition", record, True, _apply_open_acquisitions)
        pk: int = row.pk
        return pk

    async def acquisition(self, record: dict[str, Any], *, urgent: bool = False) -> None:
        """One finished acquisition (``acquisition_record``'s keyword arguments)."""
        await self._submit("acquisition", record, urgent, _apply_acquisitions)

    async def begin_delete(self, request: DeleteRequest) -> DeleteOrder | None:
        """``sandbox_begin_delete``: the order to send, or None (nothing on the backend)."""
        order: DeleteOrder | None = await self._submit(
            "begin_delete", request, False, _apply_begin_deletes
        )
        return order

    async def confirm_deleted(self, name: str) -> int | None:
        """``pending_delete_confirmed``: the sandbox id ended, if any."""
        ended: int | None = await self._submit(
            "confirm_deleted", (name, self._state.now()), False, _apply_confirmed
        )
        return ended

    async def _submit(
        self, kind: str, item: Any, urgent: bool, apply: Callable[..., list[Any]]
    ) -> Any:
        lane = self._lanes.get((kind, urgent))
        if lane is None:
            lane = self._lanes[(kind, urgent)] = _Lane(apply, URGENT if urgent else BACKGROUND)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        lane.pending.append((item, fut))
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
                taken = [(i, f) for i, f in lane.pending[: self._max] if not f.done()]
                del lane.pending[: self._max]
                if not taken:
                    continue
                self.batches += 1
                self.writes += len(taken)
                self.largest = max(self.largest, len(taken))
                try:
                    outcomes = await self._state.db.run(
                        lane.apply, [i for i, _ in taken], priority=lane.priority
                    )
                except asyncio.CancelledError:  # shutdown: nobody settles these any more
                    for _, fut in taken:
                        fut.cancel()
                    raise
                except Exception as exc:  # the whole batch failed (database gone)
                    for _, fut in taken:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                for (_, fut), outcome in zip(taken, outcomes, strict=True):
                    if fut.done():
                        continue
                    if isinstance(outcome, BaseException):
                        fut.set_exception(outcome)
                    else:
                        fut.set_result(outcome)
        finally:
            lane.busy = False
            for _, fut in lane.pending:  # only if cancelled mid-way (shutdown)
                if not fut.done():
                    fut.cancel()
            if lane.pending:
                lane.pending.clear()


def _apply_requests(items: Sequence[SandboxRequest]) -> list[Any]:
    return list(sandbox_request_many(requests=items))


def _apply_moves(items: Sequence[SandboxMove]) -> list[Any]:
    return list(sandbox_moves_apply(moves=items))


def _apply_open_acquisitions(items: Sequence[dict[str, Any]]) -> list[Any]:
    return list(acquisition_open_many(records=items))


def _apply_acquisitions(items: Sequence[dict[str, Any]]) -> list[Any]:
    return list(acquisition_record_many(records=items))


def _apply_begin_deletes(items: Sequence[DeleteRequest]) -> list[Any]:
    return list(sandbox_begin_delete_many(requests=items))


def _apply_confirmed(items: Sequence[tuple[str, Any]]) -> list[Any]:
    now = max(at for _, at in items)
    return list(pending_delete_confirmed_many(names=[name for name, _ in items], now=now))
