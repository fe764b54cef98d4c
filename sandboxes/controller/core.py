"""The controller: one asyncio loop thread that owns every create, delete and pool.

DRF views call the synchronous facade (``acquire``, ``release``, ``prewarm``, ``drain``);
each call is submitted to the loop and the calling thread blocks on the answer (async
views can await the ``a*`` variants instead and block nothing).

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
import datetime as dt
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from sandboxes.controller.acquire import AcquireMixin, AcquireRequest
from sandboxes.controller.creates import CreateMixin
from sandboxes.controller.dbexec import DbExecutor
from sandboxes.controller.lifecycle import LifecycleMixin
from sandboxes.controller.maintenance import MaintenanceMixin
from sandboxes.controller.ownership import OwnershipMixin
from sandboxes.controller.queries import JobInfo, job_info
from sandboxes.controller.reconcile import ReconcileMixin
from sandboxes.controller.runtime import (
    AcquireResult,
    JobRuntime,
    PrewarmKey,
    build_runtime,
    utc_now,
)
from sandboxes.controller.tasks import TaskMixin
from sandboxes.pacing import TokenBucket
from sandboxes.providers.base import Provider
from sandman_site.errors import ControllerUnavailable, NotFound

log = logging.getLogger(__name__)


class Controller(
    TaskMixin,
    AcquireMixin,
    CreateMixin,
    LifecycleMixin,
    MaintenanceMixin,
    ReconcileMixin,
    OwnershipMixin,
):
    """Pools, creates, deletes, reconciliation and sweeps of one service process."""

    def __init__(
        self,
        *,
        provider: Provider | None = None,
        provider_factory: Callable[[], Provider] | None = None,
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
    ) -> None:
        from django.conf import settings

        self._provider_arg = provider
        self._provider_factory = provider_factory
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
        self.health_timeout_s = health_timeout_s
        self.execd_timeout_s = execd_timeout_s
        # Warm builds and release deletes wait (at most this long) while acquires are in
        # flight: they share this process's interpreter with the hand-outs (see tasks.py).
        self.yield_to_acquires_s = yield_to_acquires_s
        self._acquiring = 0
        self._no_acquires: asyncio.Event | None = None
        self.started = False
        self.reconciled = False
        self.provider: Provider = provider  # type: ignore[assignment]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._lock = threading.Lock()
        self._db_exec: DbExecutor | None = None
        self._runtimes: dict[int, JobRuntime] = {}
        self._runtime_loading: dict[int, asyncio.Future[JobRuntime]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._calls: set[asyncio.Task[Any]] = set()
        self._inner: set[asyncio.Future[Any]] = set()
        self._background: list[asyncio.Task[Any]] = []
        self._destroying: dict[str, asyncio.Task[bool]] = {}
        self._cluster: TokenBucket | None = None
        self._http: Any = None  # aiohttp session for execd calls (checked reuse)
        self.last_sweep: dict[str, Any] | None = None

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Start the loop thread, reconcile with the backend, start periodic work."""
        with self._lock:
            if self.started:
                return
            if self.provider is None:
                factory = self._provider_factory
                if factory is None:
                    from sandboxes.providers import get_provider

                    factory = get_provider
                self.provider = factory()
            self._db_exec = DbExecutor(self._db_workers)
            self._stopping = False
            loop = asyncio.new_event_loop()
            self._loop = loop
            ready = threading.Event()
            self._thread = threading.Thread(
                target=self._run_loop, args=(loop, ready), name="sandman-controller", daemon=True
            )
            self._thread.start()
            ready.wait()
            self.started = True
            future = asyncio.run_coroutine_threadsafe(self._startup(), loop)
        future.result()

    def _run_loop(self, loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _startup(self) -> None:
        self._cluster = TokenBucket(
            self.cluster_rate,
            self.cluster_burst,
            clock=self._clock,
            sleep=self._sleep,
            name="cluster",
        )
        try:
            await self._reconcile()
            self.reconciled = True
        except Exception:
            log.exception("reconcile at start failed; the maintenance loop retries it")
        if self.maintenance_interval_s:
            self._background.append(
                asyncio.create_task(self._periodic(self.maintenance_interval_s, self._maintain))
            )
        if self.sweep_interval_s:
            self._background.append(
                asyncio.create_task(self._periodic(self.sweep_interval_s, self._sweep))
            )

    def stop(self) -> None:
        """Stop every task and close the provider. Sandboxes are left for reconcile."""
        with self._lock:
            if not self.started or self._loop is None:
                return
            loop = self._loop
            self._stopping = True
            try:
                asyncio.run_coroutine_threadsafe(self._shutdown(), loop).result(timeout=60)
            except Exception:
                log.exception("controller shutdown did not finish cleanly")
            loop.call_soon_threadsafe(loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=30)
            if self._db_exec is not None:
                self._db_exec.close()
            self.started = False
            self._loop = None
            self._thread = None
            self._runtimes.clear()

    async def _shutdown(self) -> None:
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
        for rt in self._runtimes.values():
            rt.pacer.close()
            for fut in rt.waiters.values():
                if not fut.done():
                    fut.set_exception(ControllerUnavailable("the controller is stopping"))
        if self._cluster is not None:
            self._cluster.close()
        if self._http is not None:
            await self._http.close()
            self._http = None
        try:
            await self.provider.close()
        except Exception:
            log.exception("closing the provider failed")

    async def _runtime(self, job_id: int, info: JobInfo | None = None) -> JobRuntime:
        rt = self._runtimes.get(job_id)
        if rt is not None:
            return rt
        pending = self._runtime_loading.get(job_id)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[JobRuntime] = asyncio.get_running_loop().create_future()
        self._runtime_loading[job_id] = future
        try:
            if info is None:
                info = await self._db(job_info, job_id)
            if info is None:
                raise NotFound(f"job {job_id} does not exist")
            assert self._cluster is not None
            rt = build_runtime(info, cluster=self._cluster, clock=self._clock, sleep=self._sleep)
            self._runtimes[job_id] = rt
            future.set_result(rt)
            return rt
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # retrieved: no "never retrieved" warning
            raise
        finally:
            self._runtime_loading.pop(job_id, None)

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
    ) -> AcquireResult:
        request = AcquireRequest.build(
            job_id=job_id,
            image=image,
            base_commit=base_commit,
            cpu_millis=cpu_millis,
            memory_bytes=memory_bytes,
            workspace_bytes=workspace_bytes,
            role=role,
            timeout_s=timeout_s,
            user_id=user_id,
        )
        return self._call(self._acquire(request))

    async def aacquire(self, **kwargs: Any) -> AcquireResult:
        return await self._acall(self._acquire(AcquireRequest.build(**kwargs)))

    def release(
        self,
        *,
        sandbox_id: int,
        verdict: str | None = None,
        patch_sha256: str | None = None,
        suite: str | None = None,
    ) -> None:
        self._call(
            self._release(
                sandbox_id=sandbox_id, verdict=verdict, patch_sha256=patch_sha256, suite=suite
            )
        )

    async def arelease(self, **kwargs: Any) -> None:
        await self._acall(self._release(**kwargs))

    def prewarm(self, *, job_id: int, keys: list[PrewarmKey]) -> None:
        self._call(self._prewarm(job_id=job_id, keys=list(keys)))

    def drain(self, *, job_id: int) -> None:
        self._call(self._drain(job_id=job_id))

    # -- operations for tests, commands and /metrics ------------------------------------------
    def run_maintenance(self) -> dict[str, int]:
        """One round of idle trim, lifetime reclaim, delete retries, warm fill, drained check."""
        return self._call(self._maintain())

    def sweep(self) -> dict[str, Any]:
        """Delete labelled sandboxes no live record owns; return counts."""
        return self._call(self._sweep())

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Block until every owned task (creates, deletes, checks) has finished."""
        self._call(self._wait_idle(), timeout=timeout + 5)

    async def _wait_idle(self) -> None:
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    def stats(self) -> dict[str, Any]:
        """Pacer queues and pool books per job (for /metrics and dashboards)."""
        if not self.started:
            return {"started": False, "cluster_queue": 0, "jobs": {}}
        return self._call(self._stats(), timeout=10)

    async def _stats(self) -> dict[str, Any]:
        return {
            "started": True,
            "reconciled": self.reconciled,
            "cluster_queue": self._cluster.queue_length if self._cluster else 0,
            "jobs": {
                job_id: {**rt.pool.snapshot(), "queue": rt.pacer.queue_length}
                for job_id, rt in self._runtimes.items()
            },
        }

    def pacer_queue_length(self) -> int:
        """Creates waiting for a pacer token, all jobs (cluster queue included)."""
        stats = self.stats()
        return int(stats.get("cluster_queue", 0)) + sum(
            int(j.get("queue", 0)) for j in stats.get("jobs", {}).values()
        )


_controller: Controller | None = None
_controller_lock = threading.Lock()


def get_controller() -> Controller:
    """The process-wide controller, built from settings on first use."""
    global _controller
    with _controller_lock:
        if _controller is None:
            _controller = Controller()
        return _controller


def current_controller() -> Controller | None:
    """The installed controller, or None; never builds one (for /metrics scrapes)."""
    return _controller


def set_controller(controller: Controller | None) -> None:
    """Install a controller (tests), or forget the current one (None)."""
    global _controller
    with _controller_lock:
        _controller = controller
