"""Per-job books of a started controller: looked up, or built once from the job's row.

Rule a reader must not break: one :class:`JobRuntime` per job and process. Concurrent
first uses of a job share one load (the second awaits the first's future), so two pools
never keep books for the same job; and one read of its row (:meth:`Runtimes.first_info`).
"""

from __future__ import annotations

import asyncio

from sandboxes.controller import queries
from sandboxes.controller.queries import JobInfo
from sandboxes.controller.runtime import JobRuntime, build_runtime
from sandboxes.controller.state import ControllerState
from sandboxes.controller.tasks import TaskOwner
from sandman_site.errors import NotFound


class Runtimes:
    """The job runtimes of ``state``, loaded on first use."""

    def __init__(self, state: ControllerState, tasks: TaskOwner) -> None:
        self._state = state
        self._tasks = tasks
        self._loading: dict[int, asyncio.Future[JobRuntime]] = {}
        self._reading: dict[int, asyncio.Task[JobInfo | None]] = {}

    def cached(self, job_id: int) -> JobRuntime | None:
        """The job's books if this process holds them already (no database read)."""
        return self._state.runtimes.get(job_id)

    async def first_info(self, job_id: int) -> JobInfo | None:
        """The job's row for a first use (no books yet), read ONCE for every caller that
        asks while the read is under way: a burst's acquires of a new job all arrive before
        the first read returns, and each read its own (600 reads of one row in a 600-acquire
        burst). The read is the controller's own task (urgent: callers wait), so a caller
        that leaves does not cancel it for the others; a later caller reads again."""
        task = self._reading.get(job_id)
        if task is None:
            task = self._tasks.spawn(
                self._tasks.db_now(queries.job_info, job_id), name=f"job-info-{job_id}"
            )
            self._reading[job_id] = task
            task.add_done_callback(lambda _: self._reading.pop(job_id, None))
        return await asyncio.shield(task)

    def all(self) -> list[JobRuntime]:
        """A snapshot of every job's books."""
        return list(self._state.runtimes.values())

    def holding(self, sandbox_id: int) -> JobRuntime | None:
        """The books that have ``sandbox_id`` handed out, if any."""
        return next((r for r in self.all() if sandbox_id in r.pool.in_use), None)

    async def get(self, job_id: int, info: JobInfo | None = None) -> JobRuntime:
        """The job's books, built from ``info`` (or its row) the first time."""
        rt = self._state.runtimes.get(job_id)
        if rt is not None:
            return rt
        pending = self._loading.get(job_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[JobRuntime] = asyncio.get_running_loop().create_future()
        self._loading[job_id] = future
        try:
            if info is None:
                info = await self._tasks.db(queries.job_info, job_id)
            if info is None:
                raise NotFound(f"job {job_id} does not exist")
            state = self._state
            rt = build_runtime(info, cluster=state.cluster, clock=state.clock, sleep=state.sleep)
            state.runtimes[job_id] = rt
            future.set_result(rt)
            return rt
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning
            raise
        finally:
            self._loading.pop(job_id, None)
