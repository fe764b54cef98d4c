"""Plumbing between callers' threads and the controller's loop: calls, owned tasks.

* :meth:`TaskOwner.tracked` wraps every call the facade submits to the loop, so ``stop()``
  can cancel it and its caller gets ``ControllerUnavailable``, never a hang.
* :meth:`TaskOwner.spawn` starts a task the CONTROLLER owns (creates, deletes, checks): it
  is not cancelled when the caller goes away, only at shutdown.
* :meth:`TaskOwner.settle` runs one backend call to settlement even if the awaiting task is
  cancelled (except at shutdown), so cleanup code always knows the call is over.
* :meth:`TaskOwner.db` runs ORM code on the controller's database threads, never on the
  loop; :meth:`TaskOwner.db_now` does so ahead of queued background work (a caller waits).
* :class:`AcquireGate` lets work nobody waits for step aside while acquires are in flight.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from sandboxes.controller.dbexec import URGENT
from sandboxes.controller.runtime import JobRuntime
from sandboxes.controller.state import ControllerState

log = logging.getLogger(__name__)
T = TypeVar("T")


class TaskOwner:
    """Owns every task and backend call of one started controller (its loop thread only)."""

    def __init__(self, state: ControllerState) -> None:
        self._state = state
        self._tasks: set[asyncio.Task[Any]] = set()
        self._calls: set[asyncio.Task[Any]] = set()
        self._inner: set[asyncio.Future[Any]] = set()
        self._background: list[asyncio.Task[Any]] = []

    @property
    def owned(self) -> list[asyncio.Task[Any]]:
        """The owned tasks (creates, deletes, checks) not finished yet, as a snapshot."""
        return list(self._tasks)

    async def tracked(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a facade call, known to ``shutdown`` while it runs."""
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        try:
            return await coro
        finally:
            self._calls.discard(task)

    async def db(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Background priority: creates', deletes' and sweeps' bookkeeping."""
        return await self._state.db.run(fn, *args, **kwargs)

    async def db_now(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Urgent priority: a caller is waiting for this write (hand-out, release)."""
        return await self._state.db.run(fn, *args, priority=URGENT, **kwargs)

    def spawn(
        self, coro: Coroutine[Any, Any, T], rt: JobRuntime | None = None, *, name: str = ""
    ) -> asyncio.Task[T]:
        """Start a task the controller owns (not the caller); errors are logged."""
        task = asyncio.get_running_loop().create_task(coro, name=name or None)
        self._tasks.add(task)
        if rt is not None:
            rt.tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if rt is not None:
                rt.tasks.discard(t)
                rt.notify()
            if not t.cancelled() and t.exception() is not None:
                log.error("controller task %s failed", t.get_name(), exc_info=t.exception())

        task.add_done_callback(done)
        return task

    async def settle(self, awaitable: Awaitable[T]) -> T:
        """Run a backend call to settlement even if the awaiting task is cancelled.

        Only shutdown abandons the wait. Any other cancellation waits for the call to
        finish and is then re-raised, so the caller's ``finally`` cleans up knowing the
        backend call is over.
        """
        inner = asyncio.ensure_future(awaitable)
        self._inner.add(inner)
        inner.add_done_callback(self._inner.discard)
        # At shutdown the awaiting task leaves before the call ends; retrieve its outcome
        # here so asyncio does not log "Task exception was never retrieved".
        inner.add_done_callback(_retrieve_outcome)
        cancelled = False
        while True:
            try:
                result = await asyncio.shield(inner)
                break
            except asyncio.CancelledError:
                if inner.done() or self._state.stopping:
                    raise
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError()
        return result

    def every(self, interval: float, work: Callable[[], Awaitable[Any]]) -> None:
        """Run ``work`` every ``interval`` seconds until shutdown; a failed round is logged."""
        self._background.append(asyncio.create_task(_periodic(interval, work)))

    async def wait_idle(self) -> None:
        """Return once every owned task has finished (new ones included)."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def shutdown(self) -> None:
        """Cancel periodic work, calls and owned tasks; let backend calls already sent end."""
        everything = [*self._background, *self._calls, *self._tasks]
        for task in everything:
            task.cancel()
        if everything:
            await asyncio.wait(everything, timeout=30)
        # Cancelled work may have spawned its own bookkeeping (e.g. recording a cancelled
        # acquisition): let it finish rather than destroy it pending, then cancel stragglers.
        late = [t for t in (*self._calls, *self._tasks) if not t.done()]
        if late:
            await asyncio.wait(late, timeout=10)
            for task in late:
                task.cancel()
            await asyncio.wait(late, timeout=5)
        # Backend calls already sent finish (or time out) before the provider closes.
        inner = [f for f in self._inner if not f.done()]
        if inner:
            await asyncio.wait(inner, timeout=15)


class AcquireGate:
    """Counts acquires in flight; background work waits (bounded) until there are none.

    Work nobody waits for (a warm build replacing a hand-out, the delete after a release)
    runs in the same interpreter as the hand-outs of a burst: spawning a sandbox, its
    records and its database rows would otherwise delay every answer of the burst. The
    bound (``yield_s``) keeps a steady stream of acquires from starving it.
    """

    def __init__(self, yield_s: float) -> None:
        self.yield_s = yield_s
        self._acquiring = 0
        self._none_in_flight: asyncio.Event | None = None

    @property
    def in_flight(self) -> int:
        """Acquires started and not ended."""
        return self._acquiring

    def started(self) -> None:
        self._acquiring += 1
        if self._none_in_flight is None:
            self._none_in_flight = asyncio.Event()
        self._none_in_flight.clear()

    def ended(self) -> None:
        self._acquiring -= 1
        if self._acquiring == 0 and self._none_in_flight is not None:
            self._none_in_flight.set()

    async def wait_turn(self) -> None:
        """Wait until no acquire is in flight, at most ``yield_s`` seconds."""
        event = self._none_in_flight
        if self._acquiring == 0 or event is None or self.yield_s <= 0:
            return
        try:
            await asyncio.wait_for(event.wait(), self.yield_s)
        except TimeoutError:
            return  # the bound: background work goes on beside the acquires


async def _periodic(interval: float, work: Callable[[], Awaitable[Any]]) -> None:
    while True:
        await asyncio.sleep(interval)  # a period between rounds, not synchronisation
        try:
            await work()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("periodic controller work %s failed", work.__name__)


def _retrieve_outcome(future: asyncio.Future[Any]) -> None:
    if future.cancelled():
        return
    exc = future.exception()
    if exc is not None:
        log.debug("a settled backend call failed after its caller left", exc_info=exc)
