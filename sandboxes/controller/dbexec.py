"""Run Django ORM calls for the controller's event loop on a few dedicated threads.

The ORM is synchronous and its connections are per thread. The loop never touches the
database itself: it awaits :meth:`DbExecutor.run`, which runs the call on one of
``workers`` threads (one for SQLite, whose writers serialise anyway; a few for
PostgreSQL). ``close()`` closes the connection of EVERY worker thread before the
threads end, so a stopped controller leaves no open connection behind (PostgreSQL test
databases cannot be dropped while one is open).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import close_old_connections, connections

T = TypeVar("T")


def default_workers() -> int:
    from django.conf import settings

    engine = settings.DATABASES["default"]["ENGINE"]
    return 1 if engine.endswith("sqlite3") else 4


class DbExecutor:
    def __init__(self, workers: int | None = None) -> None:
        self.workers = workers or default_workers()
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.workers, thread_name_prefix="sandman-db"
        )
        self._closed = False

    async def run(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        if self._closed:
            raise RuntimeError("the controller's database executor is closed")
        call = functools.partial(_call, fn, args, kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._pool, call)

    def close(self) -> None:
        """Close every worker's connections, then stop the workers."""
        if self._closed:
            return
        self._closed = True
        # A barrier makes each worker thread take exactly one of the close calls.
        barrier = threading.Barrier(self.workers)
        futures = [self._pool.submit(_close_here, barrier) for _ in range(self.workers)]
        concurrent.futures.wait(futures, timeout=30)
        self._pool.shutdown(wait=True)


def _call(fn: Callable[..., T], args: tuple, kwargs: dict) -> T:
    close_old_connections()
    return fn(*args, **kwargs)


def _close_here(barrier: threading.Barrier) -> None:
    try:
        barrier.wait(timeout=10)
    except threading.BrokenBarrierError:
        pass
    connections.close_all()
