"""The direct hand-out, web side: an acquire claims an offered warm pod before it asks the
controller, and a release without a verdict is written here (``SANDMAN_DIRECT_HANDOUT``,
PostgreSQL only; architecture §3.6).

``claim`` runs ``sandboxes.services.offers.sandbox_claim_offered_many`` on this process's
event loop, on an async psycopg connection of the loop's own pool (no thread, no ORM
I/O), for itself and the claims of its job and key that wait with it
(``sandboxes.apis.batches``: group commit): the oldest offered pods of the job's key
locked with ``SKIP LOCKED`` and the calls' keys taken, each pod's execd ``/health`` (a
new connection each, none kept: ``sandboxes.execd_probe``), then the hand-outs, their
events, their finished acquisitions, their keys' answers and the notifications to the
controller, pipelined with the ``COMMIT``. None when no offered pod is healthy: the
caller then asks the controller, as without it. ``release`` writes a release without a
verdict the same way, with the releases that wait with it (the rows locked, the
controller's refusals and release plan, the ``PendingDelete`` and a notification with
the delete's order, pipelined with the ``COMMIT``).

Rules a reader must not break:
* Only a rollout acquire claims (a grading acquire may need the controller's image-pin
  check and its checked-reuse pods); every other acquire goes to the controller.
* The claim's answer is the controller's warm answer (``source: "warm"``), and its rows
  are planned by the controller's own rules (``plan_move``), so nothing downstream can
  tell the two paths apart but the time they took.
* The health check runs while the row is locked, bounded by ``HEALTH_TIMEOUT_S`` (the
  controller's own bound); a pod that fails it is never handed out (the controller
  deletes it).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from django.utils import timezone

from sandboxes.apis.batches import Batches
from sandboxes.controller.acquire import AcquireRequest
from sandboxes.controller.offers import direct_handout_enabled
from sandboxes.controller.runtime import AcquireResult
from sandboxes.execd_probe import HealthProbe
from sandboxes.services.offers import (
    Claimed,
    KeyedClaim,
    KeySeen,
    OfferedPod,
    database_conninfo,
    sandbox_claim_offered_many,
    sandbox_release_direct_many,
    warm_connection,
)
from sandboxes.states import Role, SandboxSource
from sandman_site.errors import SandmanError

HEALTH_TIMEOUT_S = 5.0  # the controller's own bound on a warm pod's check (Controller)

POOL_MAX = 8  # claims in flight per worker process; each holds a connection briefly
# Connections a worker keeps open once its pool is open (``warm``: at the worker's start):
# a burst's first batches then find them instead of waiting for the pool to grow, one
# connect (a server process forked) at a time, on the cores the burst needs.
POOL_MIN = 4
APPLICATION_NAME = "sandman-direct"  # the pools' connections in pg_stat_activity
_loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Handles] = weakref.WeakKeyDictionary()


async def claim(
    *,
    job_id: int,
    user_id: int | None,
    idempotency_key: str,
    fields: dict[str, Any],
    record_answer: Callable[[AcquireResult], dict[str, Any]] | None = None,
) -> AcquireResult | None:
    """A warm pod claimed straight from the database, or None (ask the controller).

    With ``record_answer`` (a keyed call: the answer to record for a result, token-free)
    the key's history is read with the lock and the answer recorded in the hand-out's
    commit; ``KeySeen`` when the key has a history (nothing claimed: replay or recover)."""
    if not direct_handout_enabled() or fields.get("role", Role.ROLLOUT) != Role.ROLLOUT:
        return None
    started = time.monotonic()
    request = AcquireRequest.build(
        job_id=job_id, user_id=user_id, idempotency_key=idempotency_key, **fields
    )
    record = {
        "job_id": job_id,
        "user_id": user_id,
        "role": request.role,
        "image": request.image,
        "key_hash": request.key.hash,
        "started_at": timezone.now(),
        "idempotency_key": idempotency_key,
    }
    keyed = None
    if record_answer is not None:
        keyed = KeyedClaim(
            key=idempotency_key, answer=lambda pod, wait_ms: record_answer(_result(pod, wait_ms))
        )
    # It waits with the others of its job and key, and goes with them.
    claimed = await _handles().claims.call((job_id, request.key.hash), (record, started, keyed))
    if isinstance(claimed, KeySeen):
        raise claimed
    return None if claimed is None else _result(claimed.pod, claimed.wait_ms)


def _result(pod: OfferedPod, wait_ms: float) -> AcquireResult:
    """The controller's warm answer for a claimed pod."""
    return AcquireResult(
        sandbox_id=pod.sandbox_id,
        name=pod.name,
        address=pod.address,
        token=pod.token,
        source=SandboxSource.WARM.value,
        wait_ms=wait_ms,
        queue_ms=0.0,
    )


async def release(
    *,
    sandbox_id: int,
    outcome: dict[str, Any],
    key: str | None = None,
    answer: dict[str, Any] | None = None,
) -> bool:
    """Release without the controller (True), or leave it to the controller (False):
    only a release without a verdict (one with a verdict may keep a grading pod for the
    controller's reuse check). Its refusals are the controller's (the same rules). With
    ``key``, ``answer`` is recorded for it in the release's commit (``KeySeen`` when the
    key has a recorded answer: nothing released)."""
    if not direct_handout_enabled() or outcome.get("verdict") is not None:
        return False
    # It waits with the other releases, and goes with them.
    keyed = None if key is None else (key, answer or {})
    refused = await _handles().releases.call(None, (sandbox_id, keyed))
    if refused is not None:
        raise refused
    return True


# A claim waiting for its batch: its acquisition's fields, when it started, its key.
_ClaimCall = tuple[dict[str, Any], float, KeyedClaim | None]
# A release waiting for its batch: the sandbox, and its key with the answer to record.
_ReleaseCall = tuple[int, tuple[str, dict[str, Any]] | None]


class _Handles:
    """One loop's connection pool (autocommit: each claim sends its own BEGIN and COMMIT
    in one pipeline, ``offers.pipelined_transaction``) and
    health checker: their connections belong to that loop."""

    def __init__(self) -> None:
        self._pool: Any = None
        # One check per pod per claim: nothing to keep a connection for.
        self._health = HealthProbe(HEALTH_TIMEOUT_S)
        self.claims: Batches[_ClaimCall, Claimed | KeySeen | None] = Batches(self._claim_many)
        self.releases: Batches[_ReleaseCall, SandmanError | KeySeen | None] = Batches(
            self._release_many
        )

    async def _claim_many(
        self, calls: list[_ClaimCall], wanted: Callable[[int], bool]
    ) -> list[Claimed | KeySeen | None]:
        async with self.connection() as conn:
            return await sandbox_claim_offered_many(
                conn=conn,
                records=[record for record, _, _ in calls],
                starts=[started for _, started, _ in calls],
                keys=[keyed for _, _, keyed in calls],
                healthy=self.healthy,
                now=timezone.now,
                clock=time.monotonic,
                wanted=wanted,
            )

    async def _release_many(
        self, calls: list[_ReleaseCall], wanted: Callable[[int], bool]
    ) -> list[SandmanError | KeySeen | None]:
        # Every release of the batch is written: one whose caller left was asked for.
        async with self.connection() as conn:
            return await sandbox_release_direct_many(
                conn=conn,
                sandbox_ids=[sandbox_id for sandbox_id, _ in calls],
                keys=[keyed for _, keyed in calls],
                now=timezone.now(),
            )

    async def pool(self) -> Any:
        if self._pool is None:
            from psycopg_pool import AsyncConnectionPool

            pool = AsyncConnectionPool(
                database_conninfo(),
                min_size=POOL_MIN,
                max_size=POOL_MAX,
                kwargs={
                    "autocommit": True,  # offers.pipelined_transaction's BEGIN/COMMIT
                    "application_name": APPLICATION_NAME,
                },
                configure=warm_connection,  # planned once here, not in a burst's batches
                open=False,
            )
            await pool.open()
            self._pool = pool
        return self._pool

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[Any]:
        """A connection of the pool. One that the server dropped (a restart, a failover)
        fails its claim or release with psycopg's ``OperationalError`` (the API's 503
        ``database_unavailable``: ``sandman_site.dbguard``); the pool then drops it, and
        its idle connections are checked before the error goes on, so the next call gets
        a live one instead of another dead one."""
        import psycopg

        pool = await self.pool()
        try:
            async with pool.connection() as conn:
                yield conn
        except (psycopg.OperationalError, psycopg.InterfaceError):
            with contextlib.suppress(Exception):
                await pool.check()
            raise

    async def healthy(self, pod: OfferedPod) -> bool:
        return await self._health.check(pod.name, pod.address, pod.token)

    async def close(self) -> None:
        await self.claims.close()
        await self.releases.close()
        if self._pool is not None:
            await self._pool.close()
        await self._health.close()


def _handles() -> _Handles:
    loop = asyncio.get_running_loop()
    handles = _loops.get(loop)
    if handles is None:
        handles = _loops[loop] = _Handles()
    return handles


async def warm() -> bool:
    """Open the running loop's pool now (the worker's start: ``sandman_site.lifespan``), so
    a burst's first claims find ``POOL_MIN`` connections; False when the direct hand-out
    is off. It does not wait for them: a database that does not answer yet must not stop
    the worker from serving (the pool keeps trying, and a claim then fails as it would)."""
    if not direct_handout_enabled():
        return False
    await _handles().pool()
    return True


async def close() -> None:
    """Close the running loop's pool and checker (a loop that ends: a test's, a worker's
    shutdown)."""
    handles = _loops.pop(asyncio.get_running_loop(), None)
    if handles is not None:
        await handles.close()
