"""Kubernetes backend: where blocking client calls run, and the provider's own tasks.

Two small pieces the provider's collaborators share, handed over in their constructors
(``provider.py`` builds them once):

* :class:`ApiCalls` runs every blocking client call on the provider's own executor
  (``max_workers`` threads, one connection each). ``work_item_hook(op, name)`` runs first
  in that thread, so a test gate can hold a call before any request is sent.
* :class:`Background` keeps the provider's own tasks (abandoned creates settling, the
  pending-delete retrier) so ``close`` can wait for them.

Rules a reader must not break:
* A call submitted through :meth:`ApiCalls.run` runs to its end even if the awaiting task
  is cancelled: the request may already be on the wire, and its outcome is what tells the
  caller's cleanup whether a pod exists.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

WorkItemHook = Callable[[str, str], None]


class ApiCalls:
    """The provider's executor for blocking client calls, with the test gate's hook."""

    def __init__(self, max_workers: int, work_item_hook: WorkItemHook | None = None) -> None:
        self.work_item_hook = work_item_hook
        # The last calls' durations (ms) per op, for benchmarks and /metrics-style reads.
        self.durations: collections.defaultdict[str, collections.deque[float]] = (
            collections.defaultdict(lambda: collections.deque(maxlen=20_000))
        )
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="sandman-k8s"
        )

    def submit(
        self, op: str, name: str, fn: Callable[..., T], *args: Any
    ) -> concurrent.futures.Future[T]:
        """Queue ``fn(*args)``; a queued item not yet started can still be withdrawn."""
        hook = self.work_item_hook

        def item() -> T:
            if hook is not None:
                hook(op, name)  # a test gate may hold the item here, before any request
            started = time.monotonic()
            try:
                return fn(*args)
            finally:
                self.durations[op].append((time.monotonic() - started) * 1000.0)

        return self._executor.submit(item)

    async def run(self, op: str, name: str, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking client call; a cancelled caller does not stop the call."""
        answer = asyncio.wrap_future(self.submit(op, name, fn, *args))
        # If the caller is gone, nobody reads the outcome: mark it read (the caller's own
        # cancellation path has already put the pod in the pending set).
        answer.add_done_callback(lambda f: f.cancelled() or f.exception())
        return await asyncio.shield(answer)

    def shutdown(self) -> None:
        """Wait for every queued and running call (blocking: run it off the loop)."""
        self._executor.shutdown(wait=True)


class Background:
    """Tasks the provider started for itself; ``close`` waits for the ones still settling."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def running(self) -> list[asyncio.Task[Any]]:
        return list(self._tasks)
