"""The simulation clock and event queue that drive the stand-in's scheduler and kubelet.

Three modes, one code path:

* ``virtual`` (tests): events run as soon as the server loop is free and simulated time
  jumps to each event's time, so a pod is Ready in microseconds of wall time while its
  stamps still show a plausible timeline. Deterministic for a given request order.
* ``manual``: nothing happens until the test calls ``step`` / ``advance`` /
  ``run_until_idle`` -- for tests that must control the order of every stage.
* ``realtime`` (benchmarks, the CLI): an event at simulated time ``t`` runs when wall
  time reaches ``t / speed``.

Invariant: simulated time never goes backwards, and callbacks are plain functions run on
the server loop; anything that must wait (a gate, a real execd) is a task started with
:meth:`Simulation.spawn` that schedules its continuation with :meth:`Simulation.after`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import heapq
import itertools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

log = logging.getLogger(__name__)

MODES = ("virtual", "manual", "realtime")


class Simulation:
    def __init__(
        self,
        mode: str = "virtual",
        *,
        speed: float = 1.0,
        epoch: dt.datetime | None = None,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.mode = mode
        self.speed = speed
        self.epoch = epoch or dt.datetime.now(dt.UTC)
        self._wall = wall
        self._wall_start = wall()
        self._now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake: asyncio.Event | None = None
        self.events_run = 0

    # --- time ---------------------------------------------------------------------------
    @property
    def now(self) -> float:
        if self.mode == "realtime":
            self._now = max(self._now, (self._wall() - self._wall_start) * self.speed)
        return self._now

    def datetime(self, t: float | None = None) -> dt.datetime:
        return self.epoch + dt.timedelta(seconds=self.now if t is None else t)

    # --- scheduling ---------------------------------------------------------------------
    def after(self, delay: float, fn: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._heap, (self.now + max(0.0, delay), next(self._seq), fn, args))
        if self._wake is not None:
            self._wake.set()

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("stand-in task failed", exc_info=task.exception())

    @property
    def pending(self) -> int:
        return len(self._heap)

    def _run_one(self) -> None:
        t, _, fn, args = heapq.heappop(self._heap)
        self._now = max(self._now, t)
        self.events_run += 1
        try:
            fn(*args)
        except Exception:  # one broken pod must not stop the simulation
            log.exception("stand-in event %s failed", getattr(fn, "__name__", fn))

    # --- drivers ------------------------------------------------------------------------
    async def run(self) -> None:
        """Driver for ``virtual`` and ``realtime`` modes; cancelled on stop."""
        self._wake = asyncio.Event()
        if self.mode == "manual":
            return
        while True:
            if not self._heap:
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.mode == "realtime":
                delay = (self._heap[0][0] - self.now) / self.speed
                if delay > 0:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), delay)
                    except TimeoutError:
                        pass
                    continue
            self._run_one()
            await asyncio.sleep(0)  # let HTTP handlers interleave with the simulation

    def step(self) -> bool:
        """Run the next event (jumping time to it). False when the queue is empty."""
        if not self._heap:
            return False
        self._run_one()
        return True

    def advance(self, seconds: float) -> int:
        """Run every event due within ``seconds`` of now, then set the clock there."""
        target = self.now + seconds
        ran = 0
        while self._heap and self._heap[0][0] <= target:
            self._run_one()
            ran += 1
        self._now = max(self._now, target)
        return ran

    async def run_until_idle(self, max_events: int = 1_000_000) -> int:
        """Run events and wait for spawned tasks until both are exhausted."""
        ran = 0
        while ran < max_events:
            if self._heap:
                self._run_one()
                ran += 1
                await asyncio.sleep(0)
            elif self._tasks:
                await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)
            else:
                break
        return ran

    async def stop(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
