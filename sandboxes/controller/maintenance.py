"""Periodic work: reconcile until it succeeded, idle trim, lifetime reclaim, hand-outs a
restart cut and nobody claimed, lost sandboxes, delete retries, warm refill and drains
carried on.

Every step is idempotent and returns counts. A step never decides alone what another
collaborator owns: deletes go through the ``Deleter``, warm builds through the
``CreateRunner``, drains through the ``Drainer``.
"""

from __future__ import annotations

import asyncio
import logging

from sandboxes import events
from sandboxes.controller import queries
from sandboxes.controller.creates import CreateRunner
from sandboxes.controller.deletes import Deleter
from sandboxes.controller.drain import Drainer
from sandboxes.controller.offers import Offers
from sandboxes.controller.reconcile import Reconciler
from sandboxes.controller.runtimes import Runtimes
from sandboxes.controller.state import ControllerState
from sandboxes.controller.tasks import TaskOwner
from sandboxes.services.recovery import sandboxes_reclaim_unclaimed, sandboxes_unclaimed

log = logging.getLogger(__name__)


class MaintenanceRunner:
    """One round of the controller's periodic upkeep (``run``)."""

    def __init__(
        self,
        state: ControllerState,
        tasks: TaskOwner,
        runtimes: Runtimes,
        deleter: Deleter,
        creates: CreateRunner,
        drainer: Drainer,
        reconciler: Reconciler,
        unclaimed_grace_s: float,
        offers: Offers,
    ) -> None:
        self._offers = offers
        self._state = state
        self._tasks = tasks
        self._runtimes = runtimes
        self._deleter = deleter
        self._creates = creates
        self._drainer = drainer
        self._reconciler = reconciler
        self._unclaimed_grace_s = unclaimed_grace_s
        # Unclaimed hand-outs appear only at a controller's start (reconcile ends the rows
        # a dead one left): looked for until a round finds none left, then never again.
        self._unclaimed_left = True
        self._lost_run: asyncio.Task[None] | None = None
        self._lost_again = False

    async def run(self) -> dict[str, int]:
        """Idle trim, lifetime reclaim, delete retries, warm fill, drained check; counts."""
        if not self._state.reconciled:
            await self._reconciler.reconcile()
            self._state.reconciled = True
        counts = {
            # Before the trim: idle offers are withdrawn, then trimmed as warm pods.
            "offers_followed": await self._offers.round(),
            "trimmed": await self._trim_idle(),
            "reclaimed": await self._reclaim_expired(),
            "unclaimed": await self._reclaim_unclaimed(),
            "lost": await self._fail_lost(),
            "deletes_retried": await self._deleter.retry_due(),
            "warm_started": sum(self._creates.fill(rt) for rt in self._runtimes.all()),
            "drained": 0,
        }
        for job_id in await self._tasks.db(queries.draining_job_ids):
            rt = await self._runtimes.get(job_id)
            if not rt.pool.draining:
                # Drain was asked of an earlier process: carry it on here.
                self._drainer.resume(rt)
                continue
            counts["drained"] += int(await self._drainer.check_drained(rt))
        return counts

    async def _trim_idle(self) -> int:
        deletes = []
        for rt in self._runtimes.all():
            for pod in rt.pool.trim():
                deletes.append(
                    self._tasks.spawn(
                        self._deleter.delete_sandbox(
                            rt, pod.sandbox_id, reason="idle_trim", kind=events.TRIMMED
                        ),
                        rt,
                    )
                )
        if deletes:
            await asyncio.wait(deletes)
        return len(deletes)

    def lost_soon(self) -> None:
        """The provider saw a sandbox lost (``Provider.listen_lost``): fail it now, not at
        the next round -- an offered pod is claimable by the web workers until then. One
        run at a time; a loss seen during it is taken by a run queued behind it."""
        if self._state.stopping:
            return
        self._lost_again = True
        if self._lost_run is None or self._lost_run.done():
            self._lost_run = self._tasks.spawn(self._fail_lost_until_done(), name="lost-now")

    async def _fail_lost_until_done(self) -> None:
        while self._lost_again:
            self._lost_again = False
            try:
                await self._fail_lost()
            except Exception:  # the next round takes what is left
                log.exception("failing the lost sandboxes failed")

    async def _fail_lost(self) -> int:
        """Sandboxes the backend lost (evicted, node lost, Ready turned False): failed with
        the reason their holder reads, out of the pool, deleted."""
        deletes = []
        for lost in self._state.provider.take_lost():
            found = await self._deleter.record_lost(lost)
            if found is None:
                continue
            sandbox_id, job_id = found
            deletes.append(self._deleter.delete_lost(await self._runtimes.get(job_id), sandbox_id))
        if deletes:
            await asyncio.wait(deletes)
        return len(deletes)

    async def _reclaim_unclaimed(self) -> int:
        """Take back sandboxes handed to acquires a restart cut, unclaimed past the grace
        (services/recovery.py decides under each sandbox's lock)."""
        if not self._unclaimed_left:
            return 0
        taken = await self._tasks.db(
            sandboxes_reclaim_unclaimed,
            backend=self._state.backend,
            now=self._state.now(),
            grace_s=self._unclaimed_grace_s,
        )
        sends = []
        for job_id, sandbox_id, order in taken:
            log.warning("taking back sandbox %s: unclaimed after a restart", sandbox_id)
            rt = await self._runtimes.get(job_id)
            rt.pool.forget(sandbox_id)
            if order is not None:
                sends.append(self._tasks.spawn(self._deleter.destroy(order), rt))
        if sends:
            await asyncio.wait(sends)
        left = await self._tasks.db(sandboxes_unclaimed, backend=self._state.backend)
        self._unclaimed_left = bool(left)
        return len(taken)

    async def _reclaim_expired(self) -> int:
        """Take back in-use sandboxes held past their job's ``max_lifetime_s``."""
        expired = await self._tasks.db(
            queries.expired_in_use, now=self._state.now(), backend=self._state.backend
        )
        deletes = []
        for row in expired:
            rt = await self._runtimes.get(row.job_id)
            log.info("reclaiming sandbox %s: past its job's max lifetime", row.name)
            deletes.append(
                self._tasks.spawn(
                    self._deleter.delete_sandbox(
                        rt, row.id, reason="max_lifetime", kind=events.RECLAIMED
                    ),
                    rt,
                )
            )
        if deletes:
            await asyncio.wait(deletes)
        return len(deletes)
