"""Group commit for the direct hand-out: calls that wait at the same time go out together.

A web worker under a burst has dozens of acquires (and releases) in flight. Each one alone
costs its own transaction: two round trips, a lock statement, its writes, a ``COMMIT``,
and the Python that queues each statement on the connection. :class:`Batches` lets the
calls of one group (a job and key's claims; the releases) that arrive while an earlier
batch of theirs is on the database wait for the next batch, and sends that batch as ONE
call (``services.offers.sandbox_claim_offered_many``, ``sandbox_release_direct_many``).

Rules a reader must not break:
* No call waits for company: a call that finds fewer than ``IN_FLIGHT`` batches of its
  group under way starts one at once, so a lone call is exactly as fast as before; only
  calls that would otherwise queue for a connection are gathered.
* Each call gets its own answer (or the batch's exception, e.g. a lost database: every
  call of that batch fails with it, as each would have alone).
* A caller that leaves (its task cancelled) is dropped from a batch not yet sent; ``wanted``
  lets the batch drop it later too, where the batch can (a claim asks before it hands
  out).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

Item = TypeVar("Item")
Answer = TypeVar("Answer")

IN_FLIGHT = 2  # batches of one group under way at once (each holds one connection)
MOST = 32  # calls in one batch at most


class Batches(Generic[Item, Answer]):
    """Calls of a group that wait together, run together by ``run(items, wanted)``, which
    answers one result per item, in order (``wanted(i)``: whether item i's caller still
    waits)."""

    def __init__(
        self,
        run: Callable[[list[Item], Callable[[int], bool]], Awaitable[list[Answer]]],
        *,
        in_flight: int = IN_FLIGHT,
        most: int = MOST,
    ) -> None:
        self._run = run
        self._in_flight = in_flight
        self._most = most
        self._waiting: dict[Hashable, list[tuple[Item, asyncio.Future[Answer]]]] = {}
        self._running: dict[Hashable, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def call(self, group: Hashable, item: Item) -> Answer:
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(group, []).append((item, future))
        if self._running.get(group, 0) < self._in_flight:
            self._running[group] = self._running.get(group, 0) + 1
            task = asyncio.ensure_future(self._drain(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    def waiting(self, group: Hashable) -> int:
        """Calls of ``group`` waiting for a batch (not those of a batch under way)."""
        return len(self._waiting.get(group, ()))

    async def _drain(self, group: Hashable) -> None:
        """Run the group's waiting calls, a batch at a time, until none waits."""
        try:
            while waiting := self._waiting.get(group):
                batch = [(item, f) for item, f in waiting[: self._most] if not f.done()]
                del waiting[: self._most]
                if not waiting:
                    del self._waiting[group]
                if batch:
                    await self._one(batch)
        finally:
            self._running[group] -= 1
            if not self._running[group]:
                del self._running[group]

    async def _one(self, batch: list[tuple[Item, asyncio.Future[Answer]]]) -> None:
        futures = [f for _, f in batch]
        try:
            answers = await self._run([item for item, _ in batch], lambda i: not futures[i].done())
        except asyncio.CancelledError:
            for f in futures:
                f.cancel()
            raise
        except Exception as exc:  # the batch's failure is each of its calls'
            for f in futures:
                if not f.done():
                    f.set_exception(exc)
            return
        if len(answers) != len(futures):  # pragma: no cover - a broken runner
            raise AssertionError(f"{len(answers)} answers for {len(futures)} calls")
        for f, answer in zip(futures, answers, strict=True):
            if not f.done():
                f.set_result(answer)

    async def close(self) -> None:
        """Cancel the batches under way and every call still waiting (a loop that ends)."""
        for waiting in self._waiting.values():
            for _, f in waiting:
                f.cancel()
        self._waiting.clear()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
