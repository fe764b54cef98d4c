"""Drain: a job stops taking acquires, loses every sandbox, and is then ``drained``.

Ordering rules a reader must not break (paper §4.4):
* ``drain`` stops hand-outs and warm builds at once, deletes warm and in-use pods,
  and lets in-flight creates settle into deletes (the pool is draining).
* The job is ``drained`` only when the database holds no undeleted sandbox of it, and
  only after its anchor (if the backend has one) is deleted (``ownership.py``).
* A drain asked of an earlier process is carried on by this one (``resume``).
"""

from __future__ import annotations

import asyncio

from sandboxes import events
from sandboxes.controller import queries
from sandboxes.controller.deletes import Deleter
from sandboxes.controller.ownership import Ownership
from sandboxes.controller.runtime import JobRuntime
from sandboxes.controller.runtimes import Runtimes
from sandboxes.controller.state import ControllerState
from sandboxes.controller.tasks import TaskOwner
from sandboxes.services import job_mark_drained, job_mark_draining
from sandboxes.states import JobState, SandboxState
from sandman_site.errors import NotFound


class Drainer:
    """Drains jobs and marks them drained once nothing of theirs is left."""

    def __init__(
        self,
        state: ControllerState,
        tasks: TaskOwner,
        runtimes: Runtimes,
        deleter: Deleter,
        ownership: Ownership,
    ) -> None:
        self._state = state
        self._tasks = tasks
        self._runtimes = runtimes
        self._deleter = deleter
        self._ownership = ownership

    async def drain(self, *, job_id: int) -> None:
        """Mark the job draining and start deleting everything of it (idempotent)."""
        info = await self._tasks.db(queries.job_info, job_id)
        if info is None:
            raise NotFound(f"job {job_id} does not exist")
        rt = await self._runtimes.get(job_id, info)
        await self._tasks.db(job_mark_draining, job_id=job_id, now=self._state.now())
        if rt.pool.draining or info.state == JobState.DRAINED:
            return
        self.resume(rt, name=f"drain-{job_id}")

    def resume(self, rt: JobRuntime, *, name: str = "") -> None:
        """Start draining the pool's books now (warm pods first) in an owned task."""
        warm = rt.pool.drain()
        self._tasks.spawn(self._drain_job(rt, [p.sandbox_id for p in warm]), rt, name=name)

    async def _drain_job(self, rt: JobRuntime, warm_ids: list[int]) -> None:
        ids = [*warm_ids, *rt.pool.in_use, *rt.pool.checking]
        deletes = [self._delete(rt, sid) for sid in ids]
        # Sets: a row is looked up in each (12,000 in use looked up in a list held the loop
        # ~0.8 s at the drain's start).
        booked, in_flight = set(ids), {t.sandbox_id for t in rt.pool.creating.values()}
        for row in await self._tasks.db(queries.rows_of_job, job_id=rt.job_id):
            if row.id in booked or row.id in in_flight or row.state == SandboxState.DELETING:
                continue
            deletes.append(self._delete(rt, row.id))
        while rt.pool.creating:  # creates settle into deletes (the pool is draining)
            rt.changed.clear()
            await rt.changed.wait()
        if deletes:
            await asyncio.wait(deletes)
        await self.check_drained(rt)

    def _delete(self, rt: JobRuntime, sandbox_id: int) -> asyncio.Task[bool]:
        return self._tasks.spawn(
            self._deleter.delete_sandbox(
                rt, sandbox_id, reason="job_draining", kind=events.DRAINED
            ),
            rt,
        )

    async def check_drained(self, rt: JobRuntime) -> bool:
        """Mark the job drained if nothing of it is left; True if it was marked now."""
        if rt.drained or not rt.pool.draining or rt.pool.creating or not rt.pool.empty:
            return False
        if await self._tasks.db(queries.job_rows_left, job_id=rt.job_id):
            return False
        if not await self._ownership.release_owner(rt):  # the job's anchor goes last
            return False
        await self._tasks.db(job_mark_drained, job_id=rt.job_id, now=self._state.now())
        rt.drained = True
        return True
