"""The controller facade: one asyncio loop thread that owns every create, delete and pool.

DRF views call the synchronous facade (``acquire``, ``release``, ``prewarm``, ``drain``);
each call is submitted to the loop and the calling thread blocks on the answer (async
views can await the ``a*`` variants instead and block nothing). The work itself is done by
collaborators built at ``start()`` (``parts.py``), which share one ``ControllerState``.

Ordering rules a reader must not break (paper §4.4, Appendix F):
* Creates and deletes run as tasks OWNED by the controller, never by the caller: an
  acquire that times out or is cancelled stops waiting, the create goes on and its pod
  is settled by the pool (warm, handed out, or deleted). Cleanup is spawned as a new
  owned task from ``finally`` blocks, so a second cancellation cannot skip it.
* The database is touched only through :class:`DbExecutor` (never on the loop thread)
  and every row a create needs exists before the create is sent.
* ``stop()`` deletes nothing: in-flight work is abandoned and the next ``start()``
  reconciles the database with what the backend holds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from django.conf import settings

from sandboxes.addresses import AddressFloor, SubnetSource
from sandboxes.controller.acquire import AcquireRequest
from sandboxes.controller.addresswatch import AddressWatch
from sandboxes.controller.dbexec import DbExecutor
from sandboxes.controller.hooks import ControllerHooks
from sandboxes.controller.parts import Parts, Tuning
from sandboxes.controller.runtime import AcquireResult, JobRuntime, PrewarmKey, utc_now
from sandboxes.controller.state import ControllerState
from sandboxes.pacing import TokenBucket
from sandboxes.providers import get_provider
from sandboxes.providers.base import Provider
from sandman_site.errors import ControllerUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")


class Controller:
    """Pools, creates, deletes, reconciliation and sweeps of one service process."""

    def __init__(
        self,
        *,
        provider: Provider | None = None,
        provider_factory: Callable[[], Provider] | None = None,
        hooks: ControllerHooks | None = None,
        cluster_rate: float | None = None,
        cluster_burst: int | None = None,
        sweep_interval_s: float | None = None,
        maintenance_interval_s: float | None = 1.0,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], dt.datetime] = utc_now,
        sleep: Callable[[float], Awaitable[None]] | None = None,
        db_workers: int | None = None,
        health_timeout_s: float = 5.0,
        execd_timeout_s: float = 120.0,
        yield_to_acquires_s: float = 0.5,
        write_batch_max: int = 500,
        address_source: SubnetSource | None = None,
        address_floor: int | None = None,
        address_poll_s: float | None = None,
        unclaimed_grace_s: float | None = None,
    ) -> None:
        self._provider = provider
        self._provider_factory = provider_factory or get_provider
        self.hooks = hooks or ControllerHooks()
        self.cluster_rate = cluster_rate or settings.SANDMAN_CLUSTER_CREATE_RATE
        self.cluster_burst = cluster_burst or settings.SANDMAN_CLUSTER_CREATE_BURST
        self.sweep_interval_s = (
            settings.SANDMAN_SWEEP_INTERVAL_S if sweep_interval_s is None else sweep_interval_s
        )
        self.maintenance_interval_s = maintenance_interval_s
        self._clock = clock
        self._now = now
        self._sleep = sleep or asyncio.sleep
        self._db_workers = db_workers
        # Warm builds and release deletes wait (at most yield_to_acquires_s) while acquires
        # are in flight: they share this process's interpreter with the hand-outs (tasks.py).
        self.tuning = Tuning(
            health_timeout_s=health_timeout_s,
            execd_timeout_s=execd_timeout_s,
            yield_to_acquires_s=yield_to_acquires_s,
            write_batch_max=write_batch_max,
            unclaimed_grace_s=(
                settings.SANDMAN_UNCLAIMED_GRACE_S
                if unclaimed_grace_s is None
                else unclaimed_grace_s
            ),
        )
        # Free pod addresses per subnet and the floor under which creates stop (addresses.py).
        self.address_source = address_source
        self.address_floor = (
            settings.SANDMAN_ADDRESS_FLOOR if address_floor is None else address_floor
        )
        self.address_poll_s = address_poll_s or settings.SANDMAN_ADDRESS_POLL_S
        self.address_watch: AddressWatch | None = None
        self.started = False
        self._stopping = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._parts: Parts | None = None

    # -- what tests, /metrics and the API read ---------------------------------------------
    @property
    def provider(self) -> Provider:
        """The backend (built from ``provider_factory`` on first need)."""
        if self._provider is not None:
            return self._provider
        with self._lock:
            return self._ensure_provider()

    @property
    def reconciled(self) -> bool:
        """The database and the backend agreed since the last ``start()``."""
        return self._parts is not None and self._parts.state.reconciled

    @property
    def last_sweep(self) -> dict[str, Any] | None:
        """The report of the latest sweep, or None."""
        return None if self._parts is None else self._parts.sweeper.last_sweep

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The controller's event loop while started (tests run code on it), else None."""
        return self._parts.state.loop if self.started and self._parts is not None else None

    def owned_tasks(self) -> list[asyncio.Task[Any]]:
        """The owned tasks not finished yet (creates, deletes, checks). Loop thread only."""
        return [] if self._parts is None else self._parts.tasks.owned

    def job_runtime(self, job_id: int) -> JobRuntime | None:
        """A job's in-memory books, if loaded (tests inspect them). Loop thread only."""
        return None if self._parts is None else self._parts.runtimes.cached(job_id)

    def check_image(self, image: str, base_commit: str | None) -> bool | None:
        """Ask the backend about an image before anything is created (no loop needed).

        True: known good; False: the backend cannot start it; None: it cannot tell before
        a pull.
        """
        return self.provider.check_image(image, base_commit)

    def _ensure_provider(self) -> Provider:
        if self._provider is None:
            self._provider = self._provider_factory()
        return self._provider

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the loop thread, reconcile with the backend, start periodic work."""
        with self._lock:
            if self.started:
                return
            loop = asyncio.new_event_loop()
            state = ControllerState(
                provider=self._ensure_provider(),
                loop=loop,
                db=DbExecutor(self._db_workers),
                cluster=TokenBucket(
                    self.cluster_rate,
                    self.cluster_burst,
                    clock=self._clock,
                    sleep=self._sleep,
                    name="cluster",
                ),
                clock=self._clock,
                now=self._now,
                sleep=self._sleep,
                addresses=AddressFloor(self.address_floor),
                since=self._now(),
            )
            self._parts = parts = Parts.build(state, self.hooks, self.tuning)
            self._stopping = False
            ready = threading.Event()
            self._thread = threading.Thread(
                target=_run_loop, args=(loop, ready), name="sandman-controller", daemon=True
            )
            self._thread.start()
            ready.wait()
            self.started = True
            future = asyncio.run_coroutine_threadsafe(self._startup(parts), loop)
        future.result()

    async def _startup(self, parts: Parts) -> None:
        try:
            await parts.reconciler.reconcile()
            parts.state.reconciled = True
        except Exception:
            log.exception("reconcile at start failed; the maintenance loop retries it")
        parts.offers.start()  # direct hand-out: follow claims, offer the adopted warm pods
        parts.state.provider.listen_lost(parts.maintenance.lost_soon)  # losses failed at once
        if self.address_source is not None:
            self.address_watch = watch = AddressWatch(parts.state, parts.tasks, self.address_source)
            await watch.poll()  # the gate knows the subnets before the first create
            parts.tasks.every(self.address_poll_s, watch.poll)
        if self.maintenance_interval_s:
            parts.tasks.every(self.maintenance_interval_s, parts.maintenance.run)
        if self.sweep_interval_s:
            parts.tasks.every(self.sweep_interval_s, parts.sweeper.sweep)

    def stop(self) -> bool:
        """Stop every task and close the provider. Sandboxes are left for reconcile.
        True when nothing of this controller runs any more (its loop thread ended)."""
        with self._lock:
            parts = self._parts
            if not self.started or parts is None:
                return True
            loop = parts.state.loop
            self._stopping = parts.state.stopping = True
            try:
                asyncio.run_coroutine_threadsafe(parts.shutdown(), loop).result(timeout=60)
            except Exception:
                log.exception("controller shutdown did not finish cleanly")
            loop.call_soon_threadsafe(loop.stop)
            ended = True
            if self._thread is not None:
                self._thread.join(timeout=30)
                ended = not self._thread.is_alive()
            parts.state.db.close()
            self.started = False
            self._thread = None
            parts.state.runtimes.clear()
            return ended

    # -- the facade for views (sync) and async views ----------------------------------------
    def acquire(
        self,
        *,
        job_id: int,
        image: str,
        base_commit: str | None,
        cpu_millis: int,
        memory_bytes: int,
        workspace_bytes: int | None,
        role: str,
        timeout_s: float | None,
        user_id: int | None = None,
        never_used: bool = False,
        idempotency_key: str = "",
    ) -> AcquireResult:
        request = AcquireRequest.build(
            idempotency_key=idempotency_key,
            job_id=job_id,
            image=image,
            base_commit=base_commit,
            cpu_millis=cpu_millis,
            memory_bytes=memory_bytes,
            workspace_bytes=workspace_bytes,
            role=role,
            timeout_s=timeout_s,
            user_id=user_id,
            never_used=never_used,
        )
        return self._call(lambda p: p.acquirer.acquire(request))

    async def aacquire(self, **kwargs: Any) -> AcquireResult:
        request = AcquireRequest.build(**kwargs)
        return await self._acall(lambda p: p.acquirer.acquire(request))

    def release(
        self,
        *,
        sandbox_id: int,
        verdict: str | None = None,
        patch_sha256: str | None = None,
        suite: str | None = None,
    ) -> None:
        self._call(
            lambda p: p.releaser.release(
                sandbox_id=sandbox_id, verdict=verdict, patch_sha256=patch_sha256, suite=suite
            )
        )

    async def arelease(self, **kwargs: Any) -> None:
        await self._acall(lambda p: p.releaser.release(**kwargs))

    def prewarm(self, *, job_id: int, keys: list[PrewarmKey]) -> None:
        self._call(lambda p: p.releaser.prewarm(job_id=job_id, keys=list(keys)))

    def drain(self, *, job_id: int) -> None:
        self._call(lambda p: p.drainer.drain(job_id=job_id))

    async def aprewarm(self, *, job_id: int, keys: list[PrewarmKey]) -> None:
        await self._acall(lambda p: p.releaser.prewarm(job_id=job_id, keys=list(keys)))

    async def adrain(self, *, job_id: int) -> None:
        await self._acall(lambda p: p.drainer.drain(job_id=job_id))

    async def ajob_of_in_use(self, *, sandbox_id: int) -> int | None:
        """The job of a sandbox this controller handed out and has not taken back, from its
        books (no query); None if it is not in use here. A sandbox's job never changes."""
        return await self._acall(lambda p: _job_of_in_use(p, sandbox_id))

    async def astats(self) -> dict[str, Any]:
        if not self.started:
            return {"started": False, "cluster_queue": 0, "jobs": {}}
        return await self._acall(lambda p: p.stats())

    # -- operations for tests, commands and /metrics ------------------------------------------
    def run_maintenance(self) -> dict[str, int]:
        """One round of idle trim, lifetime reclaim, delete retries, warm fill, drained check."""
        return self._call(lambda p: p.maintenance.run())

    def sweep(self) -> dict[str, Any]:
        """Delete labelled sandboxes no live record owns; return counts."""
        return self._call(lambda p: p.sweeper.sweep())

    def settle_deletes(self) -> dict[str, int]:
        """Try every pending delete once, now: the provider's set, then the database's."""
        return self._call(lambda p: p.deleter.settle())

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Block until every owned task (creates, deletes, checks) has finished."""
        self._call(lambda p: p.tasks.wait_idle(), timeout=timeout + 5)

    def stats(self) -> dict[str, Any]:
        """Pacer queues and pool books per job (for /metrics and dashboards)."""
        if not self.started:
            return {"started": False, "cluster_queue": 0, "jobs": {}}
        return self._call(lambda p: p.stats(), timeout=10)

    def address_gate(self) -> dict[str, Any] | None:
        """The address gate's last reading (floor, closed, subnets), or None when no
        subnet source is configured or the controller is not started (/metrics)."""
        if not self.started or self._parts is None or self.address_source is None:
            return None
        return self._parts.state.addresses.snapshot()

    def poll_addresses(self) -> bool:
        """Read the subnets now (tests, commands); False if no source or the read failed."""
        watch = self.address_watch
        if watch is None:
            return False
        return self._call(lambda p: watch.poll())

    def pacer_queue_length(self) -> int:
        """Creates waiting for a pacer token, all jobs (cluster queue included)."""
        stats = self.stats()
        return int(stats.get("cluster_queue", 0)) + sum(
            int(j.get("queue", 0)) for j in stats.get("jobs", {}).values()
        )

    # -- submitting to the loop --------------------------------------------------------------
    def _call(
        self, work: Callable[[Parts], Coroutine[Any, Any, T]], timeout: float | None = None
    ) -> T:
        """Run ``work(parts)`` on the loop and block this (non-loop) thread on its answer."""
        parts = self._parts
        if not self.started or parts is None or self._stopping:
            raise ControllerUnavailable("the sandbox controller is not running")
        if threading.current_thread() is self._thread:
            raise RuntimeError("the controller's facade must not be called from its own loop")
        future = asyncio.run_coroutine_threadsafe(
            parts.tasks.tracked(work(parts)), parts.state.loop
        )
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError as exc:
            raise ControllerUnavailable("the sandbox controller stopped") from exc
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise ControllerUnavailable("the controller did not answer in time") from exc

    async def _acall(self, work: Callable[[Parts], Coroutine[Any, Any, T]]) -> T:
        """Run ``work(parts)`` on the loop and await it from another event loop, or
        directly when the caller already runs on the controller's loop (the web workers'
        RPC server, ``rpc.py``): no hop between threads, so no wait for the GIL."""
        parts = self._parts
        if not self.started or parts is None or self._stopping:
            raise ControllerUnavailable("the sandbox controller is not running")
        if asyncio.get_running_loop() is parts.state.loop:
            return await parts.tasks.tracked(work(parts))
        future = asyncio.run_coroutine_threadsafe(
            parts.tasks.tracked(work(parts)), parts.state.loop
        )
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            future.cancel()
            raise


async def _job_of_in_use(parts: Parts, sandbox_id: int) -> int | None:
    for job_id, rt in parts.state.runtimes.items():
        if sandbox_id in rt.pool.in_use:
            return job_id
    return None


def _run_loop(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    try:
        loop.run_forever()
    finally:
        loop.close()
