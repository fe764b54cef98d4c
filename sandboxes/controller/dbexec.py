"""Run Django ORM calls for the controller's event loop on a few dedicated threads.

The ORM is synchronous and its connections are per thread. The loop never touches the
database itself: it awaits :meth:`DbExecutor.run`, which runs the call on one of
``workers`` threads (one for SQLite, whose writers serialise anyway; a few for
PostgreSQL).

Ordering rule a reader must not break: calls are taken by PRIORITY, then in submission
order. ``URGENT`` is for writes a caller is waiting on right now (a warm hand-out, a
release); ``BACKGROUND`` (the default) for the bookkeeping of creates, deletes and sweeps.
A burst of hand-outs starts a burst of replacement creates, each with several writes: in
one FIFO queue every hand-out would wait behind them. Work of one priority keeps its
order, so a create's writes still happen in the order it issued them (it awaits each).
There is one FIFO per priority; a worker wakes once per call queued and takes the oldest
call of the most urgent non-empty FIFO (``queue.SimpleQueue`` and ``deque`` are C code; a
``PriorityQueue``'s Python-level locks and ``Condition.notify`` cost the loop more per call).

Each worker keeps its connection between calls, whatever ``CONN_MAX_AGE`` says (with a
PostgreSQL pool it is 0, which would hand the connection back and take one again on
every call); a connection that saw an error is checked and replaced if broken.
``close()`` closes the connection of EVERY worker thread before the threads end, so a
stopped controller leaves no open connection behind (PostgreSQL test databases cannot be
dropped while one is open).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.conf import settings
from django.db import connections

T = TypeVar("T")
URGENT = 0
BACKGROUND = 1


def default_workers() -> int:
    engine = settings.DATABASES["default"]["ENGINE"]
    return 1 if engine.endswith("sqlite3") else 4


class DbExecutor:
    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or default_workers()
        # One FIFO per priority, then the close sentinels (after every queued call).
        self._fifos: list[collections.deque[Any]] = [
            collections.deque() for _ in range(BACKGROUND + 2)
        ]
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()  # one token per call
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"sandman-db_{i}", daemon=True)
            for i in range(self.workers)
        ]
        for thread in self._threads:
            thread.start()

    async def run(
        self, fn: Callable[..., T], /, *args: Any, priority: int = BACKGROUND, **kwargs: Any
    ) -> T:
        """Run ``fn`` on a worker; cancelling the caller before the call starts skips it.

        The answer comes back on the caller's loop future itself (one
        ``call_soon_threadsafe``), not through a ``concurrent.futures.Future`` chained to
        one: that Future's ``Condition`` and the chaining cost the loop more than the rest
        of a small write's hand-off."""
        if self._closed:
            raise RuntimeError("the controller's database executor is closed")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue(priority, (future, loop, fn, args, kwargs))
        return await future

    def submit(
        self, fn: Callable[..., T], /, *args: Any, priority: int = BACKGROUND, **kwargs: Any
    ) -> concurrent.futures.Future[T]:
        """Queue the call now (any thread); its future is cancelled-and-skipped if
        cancelled in time."""
        if self._closed:
            raise RuntimeError("the controller's database executor is closed")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue(priority, (future, None, fn, args, kwargs))
        return future

    def _queue(self, priority: int, item: tuple[Any, ...]) -> None:
        self._fifos[min(max(priority, URGENT), BACKGROUND)].append(item)
        self._wake.put(None)

    def _take(self) -> Any:
        """The oldest call of the most urgent non-empty FIFO (one is: a token was taken)."""
        for fifo in self._fifos:
            try:
                return fifo.popleft()
            except IndexError:
                continue
        raise RuntimeError("woken with nothing queued")  # a token always has its call

    def _work(self) -> None:
        while True:
            self._wake.get()
            item = self._take()
            if item is None:  # close(): this worker's connections go with it
                connections.close_all()
                return
            future, loop, fn, args, kwargs = item
            if loop is None:
                if not future.set_running_or_notify_cancel():
                    continue
            elif future.cancelled():
                # Read off the loop: a cancel landing just after this runs the call and
                # drops its answer, as a cancel just after a call started always did.
                continue
            result: Any = None
            error: BaseException | None = None
            try:
                _drop_broken_connections()
                result = fn(*args, **kwargs)
            except BaseException as exc:  # handed to the awaiting coroutine
                error = exc
            if loop is None:
                if error is None:
                    future.set_result(result)
                else:
                    future.set_exception(error)
                continue
            try:
                loop.call_soon_threadsafe(_settle, future, result, error)
            except RuntimeError:  # that loop is closed: nobody awaits the answer
                pass
            del item, future, result, error  # no reference kept while waiting for work

    def close(self) -> None:
        """Finish the queued calls, close every worker's connections, end the workers."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._fifos[-1].append(None)  # after every queued call, whatever its priority
            self._wake.put(None)
        for thread in self._threads:
            thread.join(timeout=30)


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """On the caller's loop: hand the answer over, unless the caller gave up meanwhile."""
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _drop_broken_connections() -> None:
    """Close this thread's connections that failed and no longer answer (a restarted
    server); healthy ones are kept for the next call."""
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or not conn.errors_occurred:
            continue
        if conn.in_atomic_block:
            continue  # never close under a transaction (none is open between calls)
        if conn.is_usable():
            conn.errors_occurred = False
        else:
            conn.close()
