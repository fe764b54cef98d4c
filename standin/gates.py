"""Gates: hold the FIRST matching call at a named point until the test releases it.

Points the stand-in checks: ``create_received`` (before anything is stored),
``create_stored`` (stored, not yet answered), ``delete_received``, ``<verb>_received`` for
get/list/watch/patch, ``probe`` (the kubelet's readiness probe of a pod), ``ready`` (before
the Ready modification is stored, so no watch can deliver it) and ``work_item`` (the
provider's executor calls :meth:`GateRegistry.work_item_hook` before running a queued item).

Invariant: a gate is claimed by exactly one call (the first that matches) and every holder
is released on :meth:`GateRegistry.release_all`, which the cluster calls on stop, so a
forgotten gate can never hang a shutdown. Everything here is thread-safe: the server loop
holds, a test in another thread or loop waits for ``reached`` and calls ``release``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

POINTS = frozenset(
    {
        "create_received",
        "create_stored",
        "get_received",
        "list_received",
        "watch_received",
        "patch_received",
        "delete_received",
        "delete_applied",
        "probe",
        "ready",
        "work_item",
    }
)


@dataclass(frozen=True)
class GateContext:
    """What a gate's ``match`` sees about the call it may hold."""

    point: str
    verb: str = ""
    kind: str = "pods"
    namespace: str = ""
    name: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    body: Mapping[str, Any] | None = None


class Signal:
    """A one-shot flag that threads and coroutines in any event loop can wait for."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def set(self) -> None:
        with self._lock:
            self._event.set()
            waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # that loop is closed: nobody is waiting any more
                pass

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._event.wait(timeout)

    async def wait_async(self) -> None:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._event.is_set():
                return
            self._waiters.append((loop, fut))
        try:
            await fut
        finally:
            with self._lock:
                if (loop, fut) in self._waiters:
                    self._waiters.remove((loop, fut))


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Gate:
    """One hold. ``await gate.reached()`` / ``gate.wait_reached(t)`` then ``gate.release()``."""

    def __init__(self, point: str, match: Callable[[GateContext], bool] | None) -> None:
        if point not in POINTS:
            raise ValueError(f"unknown gate point {point!r}; one of {sorted(POINTS)}")
        self.point = point
        self.match = match
        self.context: GateContext | None = None
        self._claimed = False
        self._reached = Signal()
        self._released = Signal()

    # --- test side -----------------------------------------------------------------
    async def reached(self, timeout: float | None = 30.0) -> GateContext:
        """Wait (from any event loop) until a call is held here; return what it was."""
        await asyncio.wait_for(self._reached.wait_async(), timeout)
        assert self.context is not None
        return self.context

    def wait_reached(self, timeout: float | None = 30.0) -> GateContext:
        """Blocking form of :meth:`reached`; raises ``TimeoutError`` if nothing came."""
        if not self._reached.wait(timeout):
            raise TimeoutError(f"gate {self.point} not reached within {timeout}s")
        assert self.context is not None
        return self.context

    def release(self) -> None:
        self._released.set()

    def wait_released(self, timeout: float | None = None) -> bool:
        return self._released.wait(timeout)

    async def wait_released_async(self) -> None:
        await self._released.wait_async()

    @property
    def is_reached(self) -> bool:
        return self._reached.is_set()

    @property
    def is_released(self) -> bool:
        return self._released.is_set()

    # --- holder side -----------------------------------------------------------------
    def _try_claim(self, ctx: GateContext) -> bool:
        if self._claimed or ctx.point != self.point:
            return False
        if self.match is not None and not self.match(ctx):
            return False
        self._claimed = True
        self.context = ctx
        return True


class GateRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gates: list[Gate] = []
        self.held_total = 0

    def add(
        self,
        point: str,
        match: Callable[[GateContext], bool] | None = None,
        *,
        name: str | None = None,
        name_prefix: str | None = None,
    ) -> Gate:
        """Arm a gate. ``name``/``name_prefix`` are shorthands for common ``match``es."""
        predicates = [p for p in (match,) if p is not None]
        if name is not None:
            predicates.append(lambda ctx: ctx.name == name)
        if name_prefix is not None:
            predicates.append(lambda ctx: ctx.name.startswith(name_prefix))
        combined = (lambda ctx: all(p(ctx) for p in predicates)) if predicates else None
        gate = Gate(point, combined)
        with self._lock:
            self._gates.append(gate)
        return gate

    def claim(self, ctx: GateContext) -> Gate | None:
        """Claim the first armed gate matching ``ctx`` and mark it reached (no waiting).

        The holder must then wait for ``gate.wait_released()`` / ``wait_released_async()``.
        """
        with self._lock:
            for gate in self._gates:
                if gate._try_claim(ctx):
                    self.held_total += 1
                    break
            else:
                return None
        gate._reached.set()
        return gate

    async def hold(self, ctx: GateContext) -> None:
        """Called by the server loop at each point: hold if a gate claims this call."""
        gate = self.claim(ctx)
        if gate is not None:
            await gate.wait_released_async()

    def hold_sync(self, ctx: GateContext) -> None:
        """Thread form of :meth:`hold` (the provider's executor threads)."""
        gate = self.claim(ctx)
        if gate is not None:
            gate.wait_released()

    def work_item_hook(self, op: str, name: str) -> None:
        """Pass as the provider's ``work_item_hook`` to gate its executor items."""
        self.hold_sync(GateContext(point="work_item", verb=op, name=name))

    def release_all(self) -> None:
        with self._lock:
            gates = list(self._gates)
        for gate in gates:
            gate.release()

    def clear(self) -> None:
        self.release_all()
        with self._lock:
            self._gates.clear()

    def gates(self) -> list[Gate]:
        with self._lock:
            return list(self._gates)
