"""The controller's collaborators, built together for one ``start()`` from one state.

Each collaborator receives in its constructor only what it uses; they share nothing but
the :class:`ControllerState` and each other's PUBLIC methods. The order of construction is
the dependency order (no collaborator needs one built after it):

    TaskOwner, AcquireGate, WriteBatcher -> Runtimes, Deleter, Ownership, ReuseChecker ->
    CreateRunner -> Offers,
    WarmHandOut -> Acquirer, Drainer -> Releaser, Reconciler -> MaintenanceRunner, Sweeper

(Offers hears of pods that became warm through ``ControllerState.warm_listeners``.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sandboxes.controller.acquire import Acquirer
from sandboxes.controller.batcher import WriteBatcher
from sandboxes.controller.creates import CreateRunner
from sandboxes.controller.deletes import Deleter
from sandboxes.controller.drain import Drainer
from sandboxes.controller.hooks import ControllerHooks
from sandboxes.controller.lifecycle import Releaser
from sandboxes.controller.maintenance import MaintenanceRunner
from sandboxes.controller.offers import Offers
from sandboxes.controller.ownership import Ownership
from sandboxes.controller.reconcile import Reconciler
from sandboxes.controller.reuse import ReuseChecker
from sandboxes.controller.runtimes import Runtimes
from sandboxes.controller.state import ControllerState
from sandboxes.controller.sweep import Sweeper
from sandboxes.controller.tasks import AcquireGate, TaskOwner
from sandboxes.controller.warm import WarmHandOut
from sandman_site.errors import ControllerUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tuning:
    """Timeouts and bounds of one controller (constructor arguments of the facade)."""

    health_timeout_s: float = 5.0
    execd_timeout_s: float = 120.0
    yield_to_acquires_s: float = 0.5
    write_batch_max: int = 500  # writes per batch (batcher.py); 1 = one write per transaction
    # A hand-out a restart cut waits this long for its retry (services/recovery.py).
    unclaimed_grace_s: float = 60.0


@dataclass(frozen=True)
class Parts:
    """Every collaborator of one started controller."""

    state: ControllerState
    tasks: TaskOwner
    gate: AcquireGate
    batcher: WriteBatcher
    runtimes: Runtimes
    deleter: Deleter
    reuse: ReuseChecker
    creates: CreateRunner
    offers: Offers
    acquirer: Acquirer
    drainer: Drainer
    releaser: Releaser
    reconciler: Reconciler
    maintenance: MaintenanceRunner
    sweeper: Sweeper

    @classmethod
    def build(cls, state: ControllerState, hooks: ControllerHooks, tuning: Tuning) -> Parts:
        tasks = TaskOwner(state)
        gate = AcquireGate(tuning.yield_to_acquires_s)
        runtimes = Runtimes(state, tasks)
        batcher = WriteBatcher(state, max_batch=tuning.write_batch_max)
        deleter = Deleter(state, tasks, gate, batcher)
        ownership = Ownership(state)
        reuse = ReuseChecker(tasks, state.now, tuning.execd_timeout_s)
        creates = CreateRunner(state, tasks, gate, deleter, ownership, reuse, batcher)
        offers = Offers(state, tasks, runtimes, creates, deleter, gate)
        state.warm_listeners.append(offers.offer)
        warm = WarmHandOut(state, tasks, deleter, batcher, tuning.health_timeout_s)
        acquirer = Acquirer(state, tasks, gate, runtimes, creates, deleter, warm, batcher, offers)
        drainer = Drainer(state, tasks, runtimes, deleter, ownership)
        releaser = Releaser(state, tasks, runtimes, deleter, creates, reuse, batcher)
        reconciler = Reconciler(state, tasks, runtimes, deleter, offers, batcher)
        maintenance = MaintenanceRunner(
            state,
            tasks,
            runtimes,
            deleter,
            creates,
            drainer,
            reconciler,
            tuning.unclaimed_grace_s,
            offers,
        )
        return cls(
            state=state,
            tasks=tasks,
            gate=gate,
            batcher=batcher,
            runtimes=runtimes,
            deleter=deleter,
            reuse=reuse,
            creates=creates,
            offers=offers,
            acquirer=acquirer,
            drainer=drainer,
            releaser=releaser,
            reconciler=reconciler,
            maintenance=maintenance,
            sweeper=Sweeper(state, tasks, deleter, hooks),
        )

    async def stats(self) -> dict[str, Any]:
        """Pacer queues and pool books per job (loop thread)."""
        state = self.state
        return {
            "started": True,
            "reconciled": state.reconciled,
            "cluster_queue": state.cluster.queue_length,
            "write_batches": {
                "batches": self.batcher.batches,
                "writes": self.batcher.writes,
                "largest": self.batcher.largest,
            },
            "jobs": {
                job_id: {**rt.pool.snapshot(), "queue": rt.pacer.queue_length}
                for job_id, rt in state.runtimes.items()
            },
        }

    async def shutdown(self) -> None:
        """Cancel everything, let the batches already sent end, fail the waiters, close the
        buckets, the session, the provider."""
        state = self.state
        await self.offers.stop()
        await self.tasks.shutdown()
        await self.batcher.close()  # no batch in flight once the loop stops
        for rt in state.runtimes.values():
            rt.pacer.close()
            for fut in rt.waiters.values():
                if not fut.done():
                    fut.set_exception(ControllerUnavailable("the controller is stopping"))
        state.cluster.close()
        await self.reuse.close()
        try:
            await state.provider.close()
        except Exception:  # a provider that fails to close must not stop the shutdown
            log.exception("closing the provider failed")
