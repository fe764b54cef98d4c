"""Reconcile at start: make the database and the backend agree before serving.

Rules (paper §4.4, "what survives a restart"):
* List the backend FIRST, then read the database (rows precede creates, so a listed
  sandbox without a row is not ours to keep).
* A listed sandbox that is running and whose row is live (``ready`` or ``in_use``) in an
  active job is adopted into its job's pool books; a ready pod nobody used becomes warm
  again.
* Any other listed sandbox is deleted: known ones through their row (``deleting`` +
  pending delete), unknown ones through a pending delete without a row.
* A row in a non-terminal state with no backend sandbox is ended (``deleted``, through
  ``failed`` where the path requires it) with a ``backend_gone`` event.
* Pending deletes left by an earlier process are resumed; those whose sandbox is
  already gone are confirmed.
* Acquisitions still ``pending`` from before this controller started were in flight when
  the earlier process died: each ends ``failed`` with the reason ``service_restarted``
  (before the backend is listed, so the trainer's view is true first). One that was
  already handed its sandbox still names it; that sandbox is adopted in use *unclaimed*,
  for the keyed retry or a renew, else taken back after the grace (maintenance.py,
  services/recovery.py).
* A listed sandbox whose row is ``in_use`` but that no acquisition can have been answered
  with, nor anyone claim (``services/recovery.sandboxes_unanswered``: handed out after its
  acquire had ended, the delete that follows cut by the earlier controller's stop) is held
  by nobody: it is deleted, with an ``unanswered_hand_out`` event, never adopted.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Awaitable, Iterable
from typing import TypeVar

from sandboxes import events
from sandboxes.controller import queries
from sandboxes.controller.batcher import WriteBatcher
from sandboxes.controller.deletes import Deleter
from sandboxes.controller.offers import Offers
from sandboxes.controller.queries import SandboxRow
from sandboxes.controller.runtime import SandboxRef
from sandboxes.controller.runtimes import Runtimes
from sandboxes.controller.state import ControllerState
from sandboxes.controller.tasks import TaskOwner
from sandboxes.pool import PoolKey, WarmPod
from sandboxes.providers.base import OwnedSandbox
from sandboxes.services import (
    DeleteOrder,
    acquisitions_close_unanswered,
    pending_delete_for_unknown,
    sandbox_mark_gone,
)
from sandboxes.services.batch_deletes import DeleteRequest
from sandboxes.services.recovery import UNANSWERED_HAND_OUT, sandboxes_unanswered
from sandboxes.states import JobState, SandboxState

T = TypeVar("T")
log = logging.getLogger(__name__)


def _adoptable(row: SandboxRow, phase: str) -> bool:
    # Only a running backend sandbox can be adopted: a local sandbox whose processes died
    # with the old controller ("exited"), or a pod that failed, is deleted instead.
    if phase.lower() != "running" or row.job_state != JobState.ACTIVE:
        return False
    if row.state == SandboxState.IN_USE:
        return True
    # A ready pod is warm only if nobody used it, or it passed a reuse check.
    return row.state == SandboxState.READY and (not row.agent_used or row.reuse_count > 0)


def _key(row: SandboxRow) -> PoolKey:
    return PoolKey(
        image=row.image,
        base_commit=row.base_commit or None,
        cpu_millis=row.cpu_millis,
        memory_bytes=row.memory_bytes,
        workspace_bytes=row.workspace_bytes,
    )


class Reconciler:
    """Start-up (and retried) agreement between the database and the backend."""

    def __init__(
        self,
        state: ControllerState,
        tasks: TaskOwner,
        runtimes: Runtimes,
        deleter: Deleter,
        offers: Offers,
        batcher: WriteBatcher,
    ) -> None:
        self._state = state
        self._tasks = tasks
        self._runtimes = runtimes
        self._deleter = deleter
        self._offers = offers
        self._batcher = batcher

    async def reconcile(self) -> dict[str, int]:
        """Adopt, delete and end rows as the rules above say; return counts."""
        state, db = self._state, self._tasks.db
        now = state.now()
        # Offers of an earlier controller: withdrawn before the rows are read, so a pod is
        # either claimed (read in use) or this controller's warm pod (offered again later).
        await self._offers.clear()
        unanswered_rows = await db(
            acquisitions_close_unanswered,
            started_before=state.since or now,
            now=now,
            backend=state.backend,
        )
        # Read once the earlier controller's pending rows are ended, before the listing:
        # a hand-out of this controller names its own pending row, so none is in it.
        unanswered = set(await db(sandboxes_unanswered, backend=state.backend))
        owned = {o.name: o for o in await state.provider.list_owned()}
        rows = await db(queries.rows_not_deleted, backend=state.backend)
        # Taken once, as the rows are read: a create that settles later in the reconcile
        # still owns the row read as requested or creating.
        ours = self._creating_here()
        counts = {
            "listed": len(owned),
            "adopted": 0,
            "deleted": 0,
            "unknown": 0,
            "gone": 0,
            "unanswered_acquisitions": len(unanswered_rows),
            "unanswered_hand_outs": 0,
        }
        orders = await self._settle_listed(owned, rows, ours, unanswered, counts, now)
        confirmed: list[str] = []  # deletes the backend already finished: batched below
        for row in rows:
            if row.id in ours:
                continue  # this controller's own create, begun during the reconcile
            if row.name not in owned:
                counts["gone"] += 1
                if row.state == SandboxState.DELETING:
                    confirmed.append(row.name)
                else:
                    await db(
                        sandbox_mark_gone,
                        sandbox_id=row.id,
                        reason="no backend sandbox at controller start",
                        now=now,
                    )
        for order in await db(
            queries.pending_deletes_due, now=now, backend=state.backend, all_due=True
        ):
            if order.name not in owned:
                confirmed.append(order.name)
            else:
                orders.setdefault(order.name, order)
        await _all(self._batcher.confirm_deleted(name) for name in dict.fromkeys(confirmed))
        if orders:
            await asyncio.gather(*(self._deleter.destroy(o) for o in orders.values()))
        log.info("reconciled with the %s backend: %s", state.backend, counts)
        return counts

    async def _settle_listed(
        self,
        owned: dict[str, OwnedSandbox],
        rows: list[SandboxRow],
        ours: set[int],
        unanswered: set[int],
        counts: dict[str, int],
        now: dt.datetime,
    ) -> dict[str, DeleteOrder]:
        """Adopt or persist the delete of every listed sandbox; the deletes to send."""
        db = self._tasks.db
        orders: dict[str, DeleteOrder] = {}
        by_name = {row.name: row for row in rows}
        adopted: list[SandboxRow] = []
        deleting: list[tuple[str, DeleteRequest]] = []  # (name, its delete)
        for name, item in owned.items():
            row = by_name.get(name)
            if row is not None and row.id in ours:
                continue  # this controller's own create, begun during the reconcile
            if row is None:
                counts["unknown"] += 1
                orders[name] = await db(
                    pending_delete_for_unknown,
                    name=name,
                    backend=self._state.backend,
                    uid=item.uid,
                    nonce=item.nonce,
                    ref="",
                    reason="reconcile_unknown",
                    now=now,
                )
            elif row.state == SandboxState.IN_USE and row.id in unanswered:
                counts["unanswered_hand_outs"] += 1
                unheld = DeleteRequest(row.id, UNANSWERED_HAND_OUT, now, kind=events.UNANSWERED)
                deleting.append((name, unheld))
            elif _adoptable(row, item.phase or ""):
                await self._adopt(row)
                adopted.append(row)
                counts["adopted"] += 1
            else:
                counts["deleted"] += 1
                deleting.append((name, DeleteRequest(row.id, "reconcile", now)))
        # A failover mid-burst leaves up to ``max_creating`` creates per job to delete.
        begun = await _all(self._batcher.begin_delete(request) for _, request in deleting)
        for (name, _), order in zip(deleting, begun, strict=True):
            if order is not None:
                orders[name] = order
        # Every adoption's event at once, through the batcher (batches of up to 500): one
        # write each, in sequence, held a new leader's reconcile ~1-2 ms per live sandbox.
        await _all(
            self._batcher.event(row.id, events.ADOPTED, now, {"state": row.state})
            for row in adopted
        )
        return orders

    def _creating_here(self) -> set[int]:
        """Rows of creates THIS controller runs: it takes acquires once started, so one
        may have written its ``requested`` row (or sent its pod) before the rows were read.
        Such a row is no earlier process's leftover; ending it (no pod yet: "gone") failed
        the create with ``deleted to creating``."""
        return {
            t.sandbox_id
            for rt in self._runtimes.all()
            for t in rt.pool.creating.values()
            if t.sandbox_id is not None
        }

    async def _adopt(self, row: SandboxRow) -> None:
        rt = await self._runtimes.get(row.job_id)
        key = _key(row)
        if row.state == SandboxState.IN_USE:
            rt.pool.hand_out(row.id, key)
        else:
            rt.refs[row.id] = SandboxRef.of(row)
            rt.pool.add_warm(
                WarmPod(
                    sandbox_id=row.id,
                    key=key,
                    since=self._state.clock(),
                    role=row.role,
                    reused=row.reuse_count > 0,
                )
            )


async def _all(writes: Iterable[Awaitable[T]]) -> list[T]:
    """Every write's answer, in order (queued together: the batcher sends them in few
    batches); the first failure is raised once all have ended."""
    done = await asyncio.gather(*writes, return_exceptions=True)
    failed = next((d for d in done if isinstance(d, BaseException)), None)
    if failed is not None:
        raise failed
    return done  # type: ignore[return-value]
