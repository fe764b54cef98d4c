"""Owned creates: warm builds and the create behind an acquire, settled by the pool.

Ordering rules a reader must not break (paper §4.4, Table 2 row 1, Appendix F):
* A create runs in a task the controller owns; whoever asked for it only awaits a
  future. Its row exists before the pacer is asked, moves to ``creating`` right before
  the call is sent (after the job and cluster buckets and a ``max_creating`` slot), and
  the create is settled exactly once: handed out, kept warm, or deleted.
* The hand-out write happens INSIDE the create task, then the ticket is checked once
  more: if the acquire gave up during that write, the pod carries the agent mark and is
  deleted, never leaked and never made warm. The write names the sandbox on the waiting
  acquire's ``pending`` row (``ticket.acquisition_id``) in the same transaction, so a
  restart before the row is finished knows what it was handed (services/recovery.py).
* Any failure after the call was sent deletes whatever the backend may hold, except a
  name conflict (another workload's sandbox), which is never touched.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from django.db import DatabaseError

from sandboxes import events
from sandboxes.controller.batcher import WriteBatcher
from sandboxes.controller.deletes import Deleter
from sandboxes.controller.ownership import Ownership
from sandboxes.controller.reuse import ReuseChecker
from sandboxes.controller.runtime import CreateOutcome, JobRuntime, SandboxRef
from sandboxes.controller.state import ControllerState
from sandboxes.controller.tasks import AcquireGate, TaskOwner
from sandboxes.models import Sandbox
from sandboxes.pool import CreateTicket, Purpose, Settle, WarmPod
from sandboxes.providers.base import OwnerRef, SandboxSpec
from sandboxes.services import sandbox_fail, sandbox_mark_gone
from sandboxes.services.batch import SandboxRequest
from sandboxes.services.moves import (
    SandboxMove,
    creating_move,
    folded,
    hand_out_move,
    handle_move,
    ready_move,
)
from sandboxes.states import Role, SandboxSource
from sandman_site.errors import (
    ControllerUnavailable,
    JobNotActive,
    ProviderConflict,
    ProviderError,
    SandmanError,
)

log = logging.getLogger(__name__)


@dataclass
class _Progress:
    """How far one create got: its row, whether the call was sent, whether it settled."""

    sandbox_id: int | None = None
    sent: bool = False
    settled: bool = False


class CreateRunner:
    """Runs every create of the controller in a task it owns, and settles it."""

    def __init__(
        self,
        state: ControllerState,
        tasks: TaskOwner,
        gate: AcquireGate,
        deleter: Deleter,
        ownership: Ownership,
        reuse: ReuseChecker,
        batcher: WriteBatcher,
    ) -> None:
        self._state = state
        self._batcher = batcher
        self._tasks = tasks
        self._gate = gate
        self._deleter = deleter
        self._ownership = ownership
        self._reuse = reuse

    # -- warm builds ----------------------------------------------------------------------
    def fill(self, rt: JobRuntime) -> int:
        """Start warm builds up to each key's target (prewarm count or warm_per_key)."""
        started = 0
        if self._state.addresses.closed:  # under the address floor: no warm builds
            return 0
        for key in rt.pool.fill_plan():
            role = rt.key_roles.get(key, Role.ROLLOUT)
            admission = rt.pool.admit(key, purpose=Purpose.WARM, role=role)
            if admission.ticket is None:
                break
            started += 1
            self._tasks.spawn(self.create(rt, admission.ticket), rt, name=f"warm-{rt.job_id}")
        return started

    # -- the owned create -------------------------------------------------------------------
    async def create(self, rt: JobRuntime, ticket: CreateTicket) -> None:
        """Create one sandbox for a ticket and settle it, whatever happens to its caller."""
        progress = _Progress()
        # An acquire waits for this create: its writes go ahead of warm builds' writes,
        # and a warm build first lets the acquires in flight finish (tasks.py).
        urgent = ticket.purpose is Purpose.ACQUIRE
        try:
            if ticket.purpose is Purpose.WARM:
                await self._gate.wait_turn()
            ready_row, queue_ms, create_ms = await self._run(rt, ticket, urgent, progress)
            if rt.info.reuse_enabled and ticket.role == Role.GRADING:
                await self._reuse.take_baseline(ready_row.pk, ready_row.address, ready_row.token)
            progress.settled = True
            decision = rt.pool.settle(ticket, ready=True, agent_used=ready_row.agent_used)
            await self._apply_settlement(rt, ticket, decision, ready_row, queue_ms, create_ms)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            progress.settled = True
            rt.pool.settle(ticket, ready=False)
            self._fail_waiter(rt, ticket, exc)
            if progress.sandbox_id is not None:
                await self._fail_create(rt, progress.sandbox_id, exc, sent=progress.sent)
        finally:
            if not progress.settled:
                self._abandon_unsettled(rt, ticket, progress)
            rt.waiters.pop(ticket.ticket_id, None)
            rt.notify()

    async def _run(
        self, rt: JobRuntime, ticket: CreateTicket, urgent: bool, progress: _Progress
    ) -> tuple[Sandbox, float, float]:
        """Row, pacer, slot, send, Ready: the ready row, queue and create times (ms).

        Each write goes through the batcher: under a burst it shares one transaction and
        one query of each kind with the other creates' writes queued meanwhile. Four
        writes: the row, ``creating``, then the handle and ``ready`` as one (a failed wait
        writes the handle alone first)."""
        state, key, info, batch = self._state, ticket.key, rt.info, self._batcher
        t_admit = state.clock()
        request = SandboxRequest(
            job_id=rt.job_id,
            role=ticket.role,
            image=key.image,
            base_commit=key.base_commit,
            cpu_millis=key.cpu_millis,
            memory_bytes=key.memory_bytes,
            workspace_bytes=key.workspace_bytes,
            key_hash=key.hash,
            backend=state.backend,
            now=state.now(),
        )
        row = await batch.request(request, urgent=urgent)
        progress.sandbox_id = ticket.sandbox_id = row.pk
        # A closing address gate fails the creates waiting here (addresses.py).
        await state.addresses.while_open(rt.pacer.acquire())
        async with rt.slots:
            queue_ms = (state.clock() - t_admit) * 1000.0
            if rt.pool.draining:
                raise JobNotActive(f"job {rt.job_id} is draining")
            owner = await self._ownership.owner_for(rt)  # before sending: failure sends nothing
            await batch.move(creating_move(sandbox_id=row.pk, now=state.now()), urgent=urgent)
            progress.sent = True
            t_send = state.clock()
            handle = await self._tasks.settle(state.provider.create(_spec(rt, ticket, row, owner)))
            recorded = handle_move(
                sandbox_id=row.pk,
                uid=handle.uid,
                ref=handle.ref,
                api_created_at=state.now(),
                now=state.now(),
            )
            try:
                ready = await self._tasks.settle(
                    state.provider.wait_ready(handle, info.readiness_budget_s)
                )
            except Exception:
                await self._keep_handle(recorded, urgent)
                raise
            create_ms = (state.clock() - t_send) * 1000.0
        # The handle rides on the ready write (one write fewer per create); a restart in
        # between leaves a ``creating`` row whose pod is deleted by name and nonce (§7).
        ready_row = await batch.move(
            folded(recorded, ready_move(sandbox_id=row.pk, info=ready, now=state.now())),
            urgent=urgent,
        )
        return ready_row, queue_ms, create_ms

    async def _keep_handle(self, recorded: SandboxMove, urgent: bool) -> None:
        """A create that was stored but never got Ready: write its handle before the failure
        is recorded, so its delete goes with the UID precondition (and its ``api_created``
        time is kept). If even that fails, the delete reads the pod by name and nonce."""
        try:
            await self._batcher.move(recorded, urgent=urgent)
        except (SandmanError, DatabaseError):  # the wait's own failure is what is recorded
            log.warning("recording the handle of %s failed", recorded.sandbox_id, exc_info=True)

    def _abandon_unsettled(self, rt: JobRuntime, ticket: CreateTicket, progress: _Progress) -> None:
        """Cancelled before settling: free the ticket, tell the waiter, delete the row's pod."""
        rt.pool.settle(ticket, ready=False)
        self._fail_waiter(rt, ticket, ControllerUnavailable("the controller is stopping"))
        if progress.sandbox_id is not None and not self._state.stopping:
            self._tasks.spawn(
                self._deleter.delete_sandbox(rt, progress.sandbox_id, reason="create_cancelled"),
                rt,
            )

    async def _apply_settlement(
        self,
        rt: JobRuntime,
        ticket: CreateTicket,
        decision: Settle,
        row: Sandbox,
        queue_ms: float,
        create_ms: float,
    ) -> None:
        if decision is Settle.HAND_OUT:
            await self._hand_out(rt, ticket, row, queue_ms, create_ms)
        elif decision is Settle.WARM:
            rt.refs[row.pk] = SandboxRef.of(row)
            rt.pool.add_warm(
                WarmPod(
                    sandbox_id=row.pk, key=ticket.key, since=self._state.clock(), role=ticket.role
                )
            )
            self._state.became_warm(rt)
            late = ticket.purpose is Purpose.ACQUIRE
            await self._batcher.event(  # batched: one transaction with the others queued
                row.pk,
                events.WARM,
                self._state.now(),
                {"late": late, "create_ms": round(create_ms, 3)},
            )
        else:
            draining = rt.pool.draining
            self._fail_waiter(
                rt,
                ticket,
                JobNotActive(f"job {rt.job_id} is draining")
                if draining
                else ProviderError("the sandbox was marked used before its hand-out"),
            )
            reason = "job_draining" if draining else "late_agent_used"
            await self._deleter.delete_sandbox(
                rt, row.pk, reason=reason, kind=events.DRAINED if draining else ""
            )

    async def _hand_out(
        self, rt: JobRuntime, ticket: CreateTicket, row: Sandbox, queue_ms: float, create_ms: float
    ) -> None:
        move = hand_out_move(
            sandbox_id=row.pk,
            source=SandboxSource.CREATED.value,
            role=ticket.role,
            now=self._state.now(),
            acquisition_id=ticket.acquisition_id,
        )
        await self._batcher.move(move, urgent=True)
        rt.pool.hand_out(row.pk, ticket.key)
        waiter = rt.waiters.get(ticket.ticket_id)
        if ticket.abandoned or waiter is None or waiter.done():
            # The acquire gave up during the hand-out write: the pod carries the
            # agent mark, so it is deleted, never made warm (Table 2, row 1).
            rt.pool.forget(row.pk)
            self._tasks.spawn(
                self._deleter.delete_sandbox(rt, row.pk, reason="late_after_hand_out"), rt
            )
            return
        waiter.set_result(
            CreateOutcome(
                sandbox_id=row.pk,
                name=row.name,
                address=row.address,
                token=row.token,
                queue_ms=queue_ms,
                create_ms=create_ms,
            )
        )

    def _fail_waiter(self, rt: JobRuntime, ticket: CreateTicket, exc: BaseException) -> None:
        waiter = rt.waiters.pop(ticket.ticket_id, None)
        if waiter is None or waiter.done():
            return
        if not isinstance(exc, SandmanError):
            exc = ProviderError(f"create failed: {type(exc).__name__}: {exc}")
        waiter.set_exception(exc)
        waiter.exception()  # retrieved even if nobody awaits any more

    async def _fail_create(
        self, rt: JobRuntime, sandbox_id: int, exc: BaseException, *, sent: bool
    ) -> None:
        """A create failed: record why, then remove whatever the backend may hold."""
        reason = f"{type(exc).__name__}: {exc}"
        log.warning("create of sandbox %s failed: %s", sandbox_id, reason)
        # The backend's HTTP status when the provider reported one (detectors count 5xx);
        # our own error's status class says nothing about the API server.
        extra = exc.extra if isinstance(exc, SandmanError) else {}
        status = extra.get("status", 0) if isinstance(extra, dict) else 0
        now = self._state.now
        try:
            if not sent:
                # Never sent: nothing on the backend to delete.
                await self._tasks.db(
                    sandbox_mark_gone, sandbox_id=sandbox_id, reason=reason, now=now()
                )
                return
            await self._tasks.db(
                sandbox_fail,
                sandbox_id=sandbox_id,
                reason=reason,
                now=now(),
                detail={"status": status},
            )
            if isinstance(exc, ProviderConflict):
                # Another workload holds the name: never touch its pod (window 25).
                await self._tasks.db(
                    sandbox_mark_gone, sandbox_id=sandbox_id, reason=reason, now=now()
                )
                return
        except SandmanError:
            log.warning("recording the failed create of %s failed", sandbox_id, exc_info=True)
        await self._deleter.delete_sandbox(rt, sandbox_id, reason="create_failed")


def _spec(
    rt: JobRuntime, ticket: CreateTicket, row: Sandbox, owner: OwnerRef | None = None
) -> SandboxSpec:
    info, key = rt.info, ticket.key
    return SandboxSpec(
        name=row.name,
        nonce=row.nonce,
        token=row.token,
        job_id=rt.job_id,
        role=ticket.role,
        image=key.image,
        base_commit=key.base_commit,
        cpu_millis=key.cpu_millis,
        memory_bytes=key.memory_bytes,
        workspace_bytes=key.workspace_bytes,
        egress=info.egress,
        key_hash=key.hash,
        owner=owner,
        execd_key=info.execd_key,
        node_pool=info.node_pool,
        node_selector=info.node_selector,
        startup_script=info.startup_script,
    )
