"""The warm hand-out: one never-used (or checked) pod, health-checked, then handed out.

Ordering rules a reader must not break (paper §4.4, Table 2 row 1):
* A warm pod is taken into ``checking`` before its health check, handed out only if the
  check passes, put back if the caller left before anything changed, and deleted if it
  failed the check or the caller left during the hand-out write (it carries the agent
  mark then).
* A pod the backend sees lost now (``provider.lost_now``: Failed, or Ready turned False
  while execd still answers) is not handed out either: it is recorded lost with the
  backend's reason, as the next maintenance round would, and deleted.
* One database commit on success: the hand-out and its acquisition row's finish together
  (the row was opened ``pending`` while the health check ran, ``acquire.py``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sandboxes.controller import queries
from sandboxes.controller.batcher import WriteBatcher
from sandboxes.controller.deletes import Deleter
from sandboxes.controller.runtime import AcquireResult, JobRuntime, SandboxRef
from sandboxes.controller.state import ControllerState
from sandboxes.controller.tasks import TaskOwner
from sandboxes.pool import WarmPod
from sandboxes.providers.base import Handle
from sandboxes.services import sandbox_mark_healthy
from sandboxes.services.batch import HandOut
from sandboxes.services.moves import hand_out_move
from sandboxes.states import AcquisitionOutcome, SandboxSource, SandboxState
from sandman_site.errors import InvalidTransition, JobNotActive

log = logging.getLogger(__name__)


class WarmHandOut:
    """Health-checks a warm pod and hands it out, or takes it out of the pool."""

    def __init__(
        self,
        state: ControllerState,
        tasks: TaskOwner,
        deleter: Deleter,
        batcher: WriteBatcher,
        health_timeout_s: float,
    ) -> None:
        self._state = state
        self._tasks = tasks
        self._deleter = deleter
        self._batcher = batcher
        self._health_timeout_s = health_timeout_s

    async def try_hand_out(
        self,
        rt: JobRuntime,
        pod: WarmPod,
        role: str,
        t0: float,
        deadline: float | None,
        record: dict[str, Any],
        opened: asyncio.Task[int],
    ) -> AcquireResult | None:
        """Health-check one warm pod and hand it out; None if it was not usable.

        ``opened`` opens the acquisition row meanwhile; the hand-out waits for it."""
        sid = pod.sandbox_id
        handed = False
        try:
            ref = await self._ref(rt, sid)
            if ref is None:
                handed = True
                return None
            if not await self._healthy(ref, deadline):
                rt.pool.forget(sid)
                handed = True  # it is no longer ours to put back
                await self._tasks.db(
                    sandbox_mark_healthy, sandbox_id=sid, now=self._state.now(), healthy=False
                )
                self._tasks.spawn(self._deleter.delete_sandbox(rt, sid, reason="health_failed"), rt)
                return None
            lost = self._state.provider.lost_now(ref.name, ref.uid)
            if lost is not None:
                rt.pool.forget(sid)
                handed = True
                # Failed with the backend's reason, as the next maintenance round would
                # (which then finds the row failed and skips it), then deleted.
                await self._deleter.record_lost(lost)
                self._deleter.delete_lost(rt, sid)
                return None
            acquisition_id = await asyncio.shield(opened)  # on record before the hand-out
            handed = True
            return await self._hand_out(
                rt, pod, ref, role, t0, {**record, "acquisition_id": acquisition_id}
            )
        finally:
            if not handed and sid in rt.pool.checking:
                # Cancelled before anything changed: the pod is still a clean warm pod.
                rt.pool.add_warm(pod)
                self._state.became_warm(rt)

    async def _ref(self, rt: JobRuntime, sid: int) -> SandboxRef | None:
        """The pod's identity, cached or read; None (and forgotten) if it is not ready."""
        ref = rt.refs.get(sid)
        if ref is not None:
            return ref
        row = await self._tasks.db(queries.sandbox_row, sid)  # not cached (should not happen)
        if row is None or row.state != SandboxState.READY:
            rt.pool.forget(sid)
            return None
        ref = rt.refs[sid] = SandboxRef.of(row)
        return ref

    async def _healthy(self, ref: SandboxRef, deadline: float | None) -> bool:
        budget = self._health_timeout_s
        if deadline is not None:
            budget = max(0.05, min(budget, deadline - self._state.clock()))
        handle = Handle(ref.name, ref.nonce, ref.backend, ref.uid, ref.ref)
        try:
            return await asyncio.wait_for(
                self._state.provider.health(handle, ref.address, ref.token), budget
            )
        except TimeoutError:
            return False

    async def _hand_out(
        self,
        rt: JobRuntime,
        pod: WarmPod,
        ref: SandboxRef,
        role: str,
        t0: float,
        record: dict[str, Any],
    ) -> AcquireResult | None:
        """The hand-out write (with its acquisition row); None if the pod was taken."""
        sid = pod.sandbox_id
        source = (SandboxSource.REUSED if pod.reused else SandboxSource.WARM).value
        checked_at = self._state.now()
        wait_ms = (self._state.clock() - t0) * 1000.0
        move = hand_out_move(
            sandbox_id=sid, source=source, role=role, now=checked_at, healthy_at=checked_at
        )
        finished = {**record, "outcome": AcquisitionOutcome.OK.value, "queue_ms": 0.0}
        finished["wait_ms"] = wait_ms
        # Batched with the other hand-outs and releases queued meanwhile (batcher.py).
        write = self._tasks.spawn(self._batcher.hand_out(HandOut(move, finished)), rt)
        try:
            await asyncio.shield(write)
        except asyncio.CancelledError:
            # The caller left during the write: the pod carries the agent mark now.
            self._tasks.spawn(self._delete_after(rt, write, sid, "abandoned_hand_out"), rt)
            raise
        except InvalidTransition:
            # Taken from us meanwhile (a drain deletes pods being checked): not usable.
            rt.pool.forget(sid)
            if rt.pool.draining:
                raise JobNotActive(f"job {rt.job_id} is draining") from None
            return None
        rt.pool.hand_out(sid, pod.key)
        rt.refs.pop(sid, None)
        return AcquireResult(
            sandbox_id=sid,
            name=ref.name,
            address=ref.address,
            token=ref.token,
            source=source,
            wait_ms=wait_ms,
            queue_ms=0.0,
        )

    async def _delete_after(
        self, rt: JobRuntime, write: asyncio.Task[Any], sandbox_id: int, reason: str
    ) -> None:
        try:
            await write
        except Exception:  # whatever the write did, the pod carries the agent mark: delete it
            log.warning("hand-out write of sandbox %s failed", sandbox_id, exc_info=True)
        rt.pool.forget(sandbox_id)
        await self._deleter.delete_sandbox(rt, sandbox_id, reason=reason)
