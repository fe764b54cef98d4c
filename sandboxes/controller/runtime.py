"""Per-job state the controller keeps in memory: the pool's books, pacer, create slots.

Built once per job from its database row (pool settings never change after creation)
and rebuilt at start-up by reconciliation. Lives on the controller's loop thread only.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandboxes.controller.queries import JobInfo
from sandboxes.pacing import CompositePacer, TokenBucket
from sandboxes.pool import JobPool, PoolKey, PoolLimits


@dataclass(frozen=True)
class AcquireResult:
    sandbox_id: int
    name: str
    address: str
    token: str
    source: str  # "warm" | "reused" | "created"
    wait_ms: float
    queue_ms: float
    # Additive: the create's own time (send to Ready) when source is "created".
    create_ms: float | None = None


@dataclass(frozen=True)
class PrewarmKey:
    image: str
    base_commit: str | None
    cpu_millis: int
    memory_bytes: int
    workspace_bytes: int | None
    count: int
    role: str = "rollout"


@dataclass(frozen=True)
class CreateOutcome:
    """What a settled create hands to the acquire waiting for it."""

    sandbox_id: int
    name: str
    address: str
    token: str
    queue_ms: float
    create_ms: float


@dataclass(frozen=True)
class SandboxRef:
    """What a warm hand-out needs without reading the row: identity, address, token."""

    name: str
    nonce: str
    backend: str
    uid: str
    ref: str
    address: str
    token: str

    @classmethod
    def of(cls, row: Any) -> SandboxRef:
        """From a ``Sandbox`` model instance or a ``queries.SandboxRow``."""
        return cls(
            name=row.name,
            nonce=row.nonce,
            backend=row.backend,
            uid=row.backend_uid,
            ref=row.backend_ref,
            address=row.address,
            token=row.token,
        )


class CreateSlots:
    """The job's ``max_creating`` slots: a semaphore that also says how many wait for one.

    ``waiting`` counts the creates blocked in ``async with slots`` (for the Table A21 harness,
    which triggers a window once a create is parked here); it is exact because everything runs
    on the controller's loop.
    """

    def __init__(self, size: int) -> None:
        self._semaphore = asyncio.Semaphore(size)
        self.waiting = 0

    async def __aenter__(self) -> None:
        self.waiting += 1
        try:
            await self._semaphore.acquire()
        finally:
            self.waiting -= 1

    async def __aexit__(self, *exc: object) -> None:
        self._semaphore.release()


@dataclass
class JobRuntime:
    info: JobInfo
    pool: JobPool
    pacer: CompositePacer
    slots: CreateSlots
    waiters: dict[int, asyncio.Future[CreateOutcome]] = field(default_factory=dict)
    # Warm and checked pods' identities (no row read on the warm path); dropped at delete.
    refs: dict[int, SandboxRef] = field(default_factory=dict)
    # Role of the warm builds of a key: the prewarm's role, else the first acquire's.
    key_roles: dict[PoolKey, str] = field(default_factory=dict)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    drained: bool = False

    @property
    def job_id(self) -> int:
        return self.info.id

    def notify(self) -> None:
        """Wake whoever waits for the books to change (drain)."""
        self.changed.set()


def build_runtime(
    info: JobInfo,
    *,
    cluster: TokenBucket,
    clock: Callable[[], float],
    sleep: Callable[[float], Any],
) -> JobRuntime:
    limits = PoolLimits(
        max_live=info.max_live,
        max_creating=info.max_creating,
        warm_per_key=info.warm_per_key,
        idle_timeout_s=info.idle_timeout_s,
    )
    bucket = TokenBucket(
        info.rate_per_s, info.burst, clock=clock, sleep=sleep, name=f"job-{info.id}"
    )
    return JobRuntime(
        info=info,
        pool=JobPool(job_id=info.id, limits=limits, clock=clock),
        pacer=CompositePacer(bucket, cluster),
        slots=CreateSlots(info.max_creating),
    )


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)
