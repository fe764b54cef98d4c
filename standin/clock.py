"""``FakeClock``: a monotonic clock and an injectable ``sleep`` that move only when told.

The test double for every ``clock=`` / ``sleep=`` parameter of the service (token buckets,
acquire deadlines, readiness budgets): a test advances it instead of sleeping for real.

Rule a reader must not break: time moves only through :meth:`FakeClock.advance`, and a
sleeper wakes only once the clock has reached its due time -- never because real time
passed. ``advance`` must run on the event loop that owns the sleepers' futures.
"""

from __future__ import annotations

import asyncio
import datetime as dt


class FakeClock:
    """A monotonic clock and ``sleep`` that only move when a test calls ``advance``.

    ``sleep(d)`` returns once the clock has been advanced by ``d`` (or more); a test
    awaits ``settle()`` to let woken coroutines run. ``wall`` is an optional epoch offset
    so the same object can stamp tz-aware datetimes (see ``now()``).
    """

    def __init__(self, start: float = 1000.0, *, wall_epoch: float = 1_800_000_000.0) -> None:
        self._t = float(start)
        self._wall_offset = wall_epoch - start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def __call__(self) -> float:
        return self._t

    def monotonic(self) -> float:
        return self._t

    def now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self._t + self._wall_offset, tz=dt.UTC)

    async def sleep(self, delay: float) -> None:
        if delay <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._t + delay, fut))
        await fut

    @property
    def sleepers(self) -> int:
        return sum(1 for _, f in self._sleepers if not f.done())

    def advance(self, seconds: float) -> None:
        self._t += seconds
        due = [(t, f) for t, f in self._sleepers if t <= self._t + 1e-9]
        self._sleepers = [(t, f) for t, f in self._sleepers if t > self._t + 1e-9]
        for _, fut in due:
            if not fut.done():
                fut.set_result(None)

    @staticmethod
    async def settle(rounds: int = 20) -> None:
        """Let every ready coroutine run (no time passes)."""
        for _ in range(rounds):
            await asyncio.sleep(0)
