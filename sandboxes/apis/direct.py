"""The direct hand-out, web side: an acquire claims an offered warm pod before it asks the
controller, and a release without a verdict is written here (``SANDMAN_DIRECT_HANDOUT``,
PostgreSQL only; architecture §3.6).

``claim`` runs ``sandboxes.services.offers.sandbox_claim_offered`` in a worker thread: the
oldest offered pod of the job's key locked with ``SKIP LOCKED``, its execd's ``/health``
(on this process's event loop, over one shared session of kept connections), then the
hand-out and its finished acquisition in one commit that notifies the controller. None
when no offered pod is healthy: the caller then asks the controller, as without it.

Rules a reader must not break:
* Only a rollout acquire claims (a grading acquire may need the controller's image-pin
  check and its checked-reuse pods); every other acquire goes to the controller.
* The claim's answer is the controller's warm answer (``source: "warm"``), and its rows
  are written by the controller's own hand-out service, so nothing downstream can tell the
  two paths apart but the time they took.
* The health check runs while the row is locked, bounded by ``HEALTH_TIMEOUT_S`` (the
  controller's own bound); a pod that fails it is never handed out (the controller
  deletes it).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async
from django.db import close_old_connections
from django.utils import timezone

from sandboxes.controller.acquire import AcquireRequest
from sandboxes.controller.offers import direct_handout_enabled
from sandboxes.controller.runtime import AcquireResult
from sandboxes.providers.local.health import ExecdHealth
from sandboxes.services.offers import (
    OfferedPod,
    sandbox_claim_offered,
    sandbox_release_direct,
)
from sandboxes.states import Role, SandboxSource

HEALTH_TIMEOUT_S = 5.0  # the controller's own bound on a warm pod's check (Controller)

_checkers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ExecdHealth] = (
    weakref.WeakKeyDictionary()
)


async def claim(
    *, job_id: int, user_id: int | None, idempotency_key: str, fields: dict[str, Any]
) -> AcquireResult | None:
    """A warm pod claimed straight from the database, or None (ask the controller)."""
    if not direct_handout_enabled() or fields.get("role", Role.ROLLOUT) != Role.ROLLOUT:
        return None
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
    claimed = await sync_to_async(_claim_in_thread, thread_sensitive=False)(
        record, time.monotonic()
    )
    if claimed is None:
        return None
    pod = claimed.pod
    return AcquireResult(
        sandbox_id=pod.sandbox_id,
        name=pod.name,
        address=pod.address,
        token=pod.token,
        source=SandboxSource.WARM.value,
        wait_ms=claimed.wait_ms,
        queue_ms=0.0,
    )


def _claim_in_thread(record: dict[str, Any], started: float) -> Any:
    close_old_connections()  # as Django does at a request's start and end: this thread
    try:  # is one of asgiref's executor's, its connection back to the pool after the claim

        def healthy(pod: OfferedPod) -> bool:
            return bool(async_to_sync(_check)(pod.name, pod.address, pod.token))

        return sandbox_claim_offered(
            record=record, healthy=healthy, now=timezone.now, clock=time.monotonic, started=started
        )
    finally:
        close_old_connections()


async def release(*, sandbox_id: int, outcome: dict[str, Any]) -> bool:
    """Release without the controller (True), or leave it to the controller (False):
    only a release without a verdict (one with a verdict may keep a grading pod for the
    controller's reuse check). Its refusals are the controller's (the same service)."""
    if not direct_handout_enabled() or outcome.get("verdict") is not None:
        return False
    await sync_to_async(_release_in_thread, thread_sensitive=False)(sandbox_id)
    return True


def _release_in_thread(sandbox_id: int) -> None:
    close_old_connections()
    try:
        sandbox_release_direct(sandbox_id=sandbox_id, now=timezone.now())
    finally:
        close_old_connections()


async def _check(name: str, address: str, token: str) -> bool:
    """execd's ``/health``, by the checker of the running loop (its kept connections
    belong to that loop: one per worker process, one per loop in a test)."""
    loop = asyncio.get_running_loop()
    checker = _checkers.get(loop)
    if checker is None:
        checker = _checkers[loop] = ExecdHealth(HEALTH_TIMEOUT_S)
    return await checker.check(name, address, token)


async def close() -> None:
    """Close the running loop's checker (a loop that ends: a test's, a worker's shutdown)."""
    checker = _checkers.pop(asyncio.get_running_loop(), None)
    if checker is not None:
        await checker.close()
