"""Deletes: persisted first, sent once per name, retried until the backend confirms.

Ordering rules a reader must not break (paper §4.4, Table 2 row 3):
* A delete is persisted first (``deleting`` + ``PendingDelete`` in one transaction),
  then sent. A failed send only reschedules it; the row goes only when the backend
  confirms. One destroy per name is in flight at a time (``state.destroying``).
* A name that now holds another workload's sandbox (``ProviderConflict``) is confirmed
  gone for us and left alone (Appendix F, window 25).
* ``settle`` tries every pending delete now -- the provider's own pending set and every
  ``PendingDelete`` row, due or not -- so tests and benchmarks settle deterministically
  instead of waiting for the backoff.
"""

from __future__ import annotations

import asyncio
import logging

from sandboxes import events
from sandboxes.controller import queries
from sandboxes.controller.batcher import WriteBatcher
from sandboxes.controller.runtime import JobRuntime
from sandboxes.controller.state import ControllerState
from sandboxes.controller.tasks import AcquireGate, TaskOwner
from sandboxes.providers.base import Handle, LostSandbox
from sandboxes.services import DeleteOrder, pending_delete_failed, sandbox_mark_lost
from sandboxes.services.batch_deletes import DeleteRequest
from sandman_site.errors import ProviderConflict

log = logging.getLogger(__name__)


class Deleter:
    """Every delete the controller sends, and the retries of those not confirmed."""

    def __init__(
        self, state: ControllerState, tasks: TaskOwner, gate: AcquireGate, batcher: WriteBatcher
    ) -> None:
        self._state = state
        self._tasks = tasks
        self._gate = gate
        self._batcher = batcher

    async def delete_sandbox(
        self, rt: JobRuntime | None, sandbox_id: int, *, reason: str, kind: str = ""
    ) -> bool:
        """Persist the delete, then send it. True once the backend confirmed it."""
        if rt is not None:
            rt.pool.forget(sandbox_id)
            rt.refs.pop(sandbox_id, None)
        request = DeleteRequest(
            sandbox_id=sandbox_id, reason=reason, now=self._state.now(), kind=kind
        )
        order = await self._batcher.begin_delete(request)  # batched with other deletes
        if order is None:
            return True
        return await self.destroy(order)

    async def record_lost(self, lost: LostSandbox) -> tuple[int, int] | None:
        """A sandbox the backend lost (evicted, node lost, Ready turned False), failed with
        the reason its holder reads: ``(sandbox id, job id)``, or None when no live row has
        its name and uid (failed already, or gone). Its delete is the caller's
        (:meth:`delete_lost`)."""
        found = await self._tasks.db(
            sandbox_mark_lost,
            name=lost.name,
            uid=lost.uid,
            reason=lost.reason,
            message=lost.message,
            backend=self._state.backend,
            now=self._state.now(),
        )
        if found is None:
            return None
        sandbox_id, job_id, before = found
        log.warning("sandbox %s lost while %s: %s", lost.name, before, lost.reason)
        return sandbox_id, job_id

    def delete_lost(self, rt: JobRuntime, sandbox_id: int) -> asyncio.Task[bool]:
        """The delete of a lost sandbox, as an owned task (its ``lost`` event)."""
        return self._tasks.spawn(
            self.delete_sandbox(rt, sandbox_id, reason="lost", kind=events.LOST), rt
        )

    async def destroy(self, order: DeleteOrder) -> bool:
        """Send a persisted delete (joining the one in flight for its name, if any)."""
        destroying = self._state.destroying
        task = destroying.get(order.name)
        if task is None:
            task = self._tasks.spawn(self._destroy_once(order), name=f"destroy-{order.name}")
            destroying[order.name] = task
            task.add_done_callback(lambda _t: destroying.pop(order.name, None))
        return await asyncio.shield(task)

    async def destroy_later(self, order: DeleteOrder) -> bool:
        """``destroy`` once the acquires in flight are answered (``AcquireGate``)."""
        await self._gate.wait_turn()
        return await self.destroy(order)

    async def _destroy_once(self, order: DeleteOrder) -> bool:
        state = self._state
        handle = Handle(
            name=order.name, nonce=order.nonce, backend=order.backend, uid=order.uid, ref=order.ref
        )
        try:
            await self._tasks.settle(state.provider.destroy(handle))
        except asyncio.CancelledError:
            raise
        except ProviderConflict as exc:
            log.warning("not deleting %s: %s", order.name, exc)
        except Exception as exc:  # any backend failure: the delete stays pending, retried
            log.warning("delete of %s failed (will retry): %s", order.name, exc, exc_info=True)
            await self._tasks.db(
                pending_delete_failed,
                name=order.name,
                error=f"{type(exc).__name__}: {exc}",
                now=state.now(),
            )
            return False
        await self._batcher.confirm_deleted(order.name)
        return True

    async def retry_due(self, *, all_due: bool = False) -> int:
        """Send the pending deletes whose backoff has passed (every one with ``all_due``)."""
        orders = await self._tasks.db(
            queries.pending_deletes_due,
            now=self._state.now(),
            backend=self._state.backend,
            all_due=all_due,
        )
        orders = [o for o in orders if o.name not in self._state.destroying]
        if orders:
            await asyncio.gather(*(self.destroy(o) for o in orders))
        return len(orders)

    async def settle(self) -> dict[str, int]:
        """Try every pending delete once, now: the provider's set, then the database's."""
        flushed = await self._state.provider.flush_pending()
        retried = await self.retry_due(all_due=True)
        return {"provider_confirmed": flushed, "rows_retried": retried}
