"""Plumbing between callers' threads and the controller's loop: calls, owned tasks.

* ``_call`` / ``_acall`` submit a coroutine to the loop from a view's thread (blocking)
  or from another event loop (awaiting); every submitted call is tracked so ``stop()``
  can cancel it and its caller gets ``ControllerUnavailable``, never a hang.
* ``_spawn`` starts a task the CONTROLLER owns (creates, deletes, checks): it is not
  cancelled when the caller goes away, only at shutdown.
* ``_settle`` runs one backend call to settlement even if the awaiting task is cancelled
  (except at shutdown), so cleanup code always knows the call is over.
* ``_db`` runs ORM code on the controller's database threads, never on the loop;
  ``_db_now`` does so ahead of queued background work (a caller waits for it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from sandboxes.controller.dbexec import URGENT
from sandboxes.controller.runtime import JobRuntime
from sandman_site.errors import ControllerUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")


class TaskMixin:
    """Loop plumbing of :class:`sandboxes.controller.core.Controller`."""

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        loop = self._loop
        if not self.started or loop is None or self._stopping:
            coro.close()
            raise ControllerUnavailable("the sandbox controller is not running")
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("the controller's facade must not be called from its own loop")
        future = asyncio.run_coroutine_threadsafe(self._tracked(coro), loop)
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError as exc:
            raise ControllerUnavailable("the sandbox controller stopped") from exc
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise ControllerUnavailable("the controller did not answer in time") from exc

    async def _acall(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self._loop
        if not self.started or loop is None or self._stopping:
            coro.close()
            raise ControllerUnavailable("the sandbox controller is not running")
        future = asyncio.run_coroutine_threadsafe(self._tracked(coro), loop)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise

    async def _tracked(self, coro: Coroutine[Any, Any, T]) -> T:
        task = asyncio.current_task()
        assert task is not None
        self._calls.add(task)
        try:
            return await coro
        finally:
            self._calls.discard(task)

    async def _db(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Background priority: creates', deletes' and sweeps' bookkeeping."""
        assert self._db_exec is not None
        return await self._db_exec.run(fn, *args, **kwargs)

    async def _db_now(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Urgent priority: a caller is waiting for this write (hand-out, release)."""
        assert self._db_exec is not None
        return await self._db_exec.run(fn, *args, priority=URGENT, **kwargs)

    def _spawn(
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

    # -- acquires first ---------------------------------------------------------------------
    def _acquire_started(self) -> None:
        self._acquiring += 1
        if self._no_acquires is None:
            self._no_acquires = asyncio.Event()
        self._no_acquires.clear()

    def _acquire_ended(self) -> None:
        self._acquiring -= 1
        if self._acquiring == 0 and self._no_acquires is not None:
            self._no_acquires.set()

    async def _yield_to_acquires(self) -> None:
        """Wait until no acquire is in flight, at most ``yield_to_acquires_s``.

        Work nobody waits for (a warm build replacing a hand-out, the delete after a
        release) runs in the same interpreter as the hand-outs of a burst: spawning a
        sandbox, its records and its database rows would otherwise delay every answer
        of the burst. The bound keeps a steady stream of acquires from starving it.
        """
        event = self._no_acquires
        if self._acquiring == 0 or event is None or self.yield_to_acquires_s <= 0:
            return
        try:
            await asyncio.wait_for(event.wait(), self.yield_to_acquires_s)
        except TimeoutError:
            pass

    async def _settle(self, awaitable: Awaitable[T]) -> T:
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
                if inner.done() or self._stopping:
                    raise
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError()
        return result

    async def _periodic(self, interval: float, work: Callable[[], Awaitable[Any]]) -> None:
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
