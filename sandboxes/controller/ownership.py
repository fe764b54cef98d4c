"""Who owns a job's sandboxes besides the controller, and settling deletes on demand.

* Owner references (ARCHITECTURE.md §3, paper §4.4): a backend that can name an owner
  (``provider.owner_for``, the Kubernetes provider) gets one per job -- the trainer pod
  when it lives in the sandbox namespace, else the job's anchor object, created by the
  job's first create. The owner is resolved BEFORE the create moves to ``creating``, so
  a failed lookup sends nothing. The anchor is deleted when the job is drained (every
  row deleted), never earlier: the garbage collector would take pods still being
  settled with it. A backend without owners (``local``) is untouched.
* ``settle_deletes`` tries every pending delete now -- the provider's own pending set
  and every ``PendingDelete`` row, due or not -- so tests and benchmarks settle
  deterministically instead of waiting for the backoff.
* ``_await_deadline`` waits for an acquire's create on the controller's injected
  ``sleep``: with the real ``asyncio.sleep`` it is ``asyncio.wait_for``; with a fake
  clock a test expires an acquire timeout by advancing the clock once the window it
  wants is held by a gate (Table A21, windows 4, 10-14 and 18), never by a timer.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, TypeVar

from sandboxes.controller.runtime import JobRuntime
from sandboxes.providers.base import OwnerRef
from sandman_site.errors import ProviderError

log = logging.getLogger(__name__)
T = TypeVar("T")


class OwnershipMixin:
    """Owner references, anchors and delete settlement of the controller."""

    async def _owner_for(self, rt: JobRuntime) -> OwnerRef | None:
        info = rt.info
        trainer = None
        if info.trainer_pod_name and info.trainer_pod_uid:
            trainer = OwnerRef(kind="Pod", name=info.trainer_pod_name, uid=info.trainer_pod_uid)
        owner_for = getattr(self.provider, "owner_for", None)
        if owner_for is None:
            return trainer
        return await owner_for(rt.job_id, trainer)

    async def _release_owner(self, rt: JobRuntime) -> bool:
        """Delete the drained job's anchor (if the backend has one); False to retry later."""
        delete_anchor = getattr(self.provider, "delete_anchor", None)
        if delete_anchor is None:
            return True
        try:
            await delete_anchor(rt.job_id)
        except ProviderError:
            log.warning("anchor of job %s not deleted yet; retried", rt.job_id, exc_info=True)
            return False
        return True

    async def _await_deadline(self, waiter: asyncio.Future[T], remaining: float | None) -> T:
        """``waiter``'s result (never cancelling it), or ``TimeoutError`` after ``remaining``
        seconds on the injected sleep."""
        if remaining is None or self._sleep is asyncio.sleep:
            return await asyncio.wait_for(asyncio.shield(waiter), remaining)
        timer = asyncio.ensure_future(self._sleep(remaining))
        try:
            await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        if waiter.done():
            return waiter.result()
        raise TimeoutError

    # -- facade (any thread but the loop's) ---------------------------------------------
    def settle_deletes(self) -> dict[str, int]:
        """Try every pending delete once, now: the provider's set, then the database's."""
        return self._call(self._settle_deletes())

    async def _settle_deletes(self) -> dict[str, Any]:
        flush = getattr(self.provider, "flush_pending", None)
        flushed = await flush() if flush is not None else 0
        retried = await self._retry_deletes(all_due=True)
        return {"provider_confirmed": flushed, "rows_retried": retried}
