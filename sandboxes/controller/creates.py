"""Owned creates: warm builds and the create behind an acquire, settled by the pool.

Ordering rules a reader must not break (paper §4.4, Table 2 row 1, Appendix F):
* A create runs in a task the controller owns; whoever asked for it only awaits a
  future. Its row exists before the pacer is asked, moves to ``creating`` right before
  the call is sent (after the job and cluster buckets and a ``max_creating`` slot), and
  the create is settled exactly once: handed out, kept warm, or deleted.
* The hand-out write happens INSIDE the create task, then the ticket is checked once
  more: if the acquire gave up during that write, the pod carries the agent mark and is
  deleted, never leaked and never made warm.
* Any failure after the call was sent deletes whatever the backend may hold, except a
  name conflict (another workload's sandbox), which is never touched.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sandboxes import events
from sandboxes.controller.runtime import CreateOutcome, JobRuntime, SandboxRef
from sandboxes.pool import CreateTicket, Purpose, Settle, WarmPod
from sandboxes.providers.base import OwnerRef, SandboxSpec
from sandboxes.services import (
    sandbox_fail,
    sandbox_hand_out,
    sandbox_mark_creating,
    sandbox_mark_gone,
    sandbox_mark_ready,
    sandbox_record_event,
    sandbox_record_handle,
    sandbox_request,
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


class CreateMixin:
    """Creates of :class:`sandboxes.controller.core.Controller`."""

    # -- warm builds ----------------------------------------------------------------------
    def _fill(self, rt: JobRuntime) -> int:
        """Start warm builds up to each key's target (prewarm count or warm_per_key)."""
        started = 0
        for key in rt.pool.fill_plan():
            role = rt.key_roles.get(key, Role.ROLLOUT)
            admission = rt.pool.admit(key, purpose=Purpose.WARM, role=role)
            if admission.ticket is None:
                break
            started += 1
            self._spawn(self._create(rt, admission.ticket), rt, name=f"warm-{rt.job_id}")
        return started

    # -- the owned create -------------------------------------------------------------------
    async def _create(self, rt: JobRuntime, ticket: CreateTicket) -> None:
        """Create one sandbox for a ticket and settle it, whatever happens to its caller."""
        key, info = ticket.key, rt.info
        sandbox_id: int | None = None
        sent = False
        settled = False
        t_admit = self._clock()
        # An acquire waits for this create: its writes go ahead of warm builds' writes,
        # and a warm build first lets the acquires in flight finish (tasks.py).
        db = self._db_now if ticket.purpose is Purpose.ACQUIRE else self._db
        try:
            if ticket.purpose is Purpose.WARM:
                await self._yield_to_acquires()
            row = await db(
                sandbox_request,
                job_id=rt.job_id,
                role=ticket.role,
                image=key.image,
                base_commit=key.base_commit,
                cpu_millis=key.cpu_millis,
                memory_bytes=key.memory_bytes,
                workspace_bytes=key.workspace_bytes,
                key_hash=key.hash,
                backend=self.provider.name,
                now=self._now(),
            )
            sandbox_id = ticket.sandbox_id = row.pk
            await rt.pacer.acquire()
            async with rt.slots:
                queue_ms = (self._clock() - t_admit) * 1000.0
                if rt.pool.draining:
                    raise JobNotActive(f"job {rt.job_id} is draining")
                owner = await self._owner_for(rt)  # before sending: a failure sends nothing
                await db(sandbox_mark_creating, sandbox_id=row.pk, now=self._now())
                sent = True
                t_send = self._clock()
                spec = self._spec(rt, ticket, row, owner)
                handle = await self._settle(self.provider.create(spec))
                await db(
                    sandbox_record_handle,
                    sandbox_id=row.pk,
                    uid=handle.uid,
                    ref=handle.ref,
                    api_created_at=self._now(),
                    now=self._now(),
                )
                ready = await self._settle(
                    self.provider.wait_ready(handle, info.readiness_budget_s)
                )
                create_ms = (self._clock() - t_send) * 1000.0
            ready_row = await db(sandbox_mark_ready, sandbox_id=row.pk, info=ready, now=self._now())
            if info.reuse_enabled and ticket.role == Role.GRADING:
                await self._take_baseline(rt, row.pk, ready_row.address, ready_row.token)
            settled = True
            decision = rt.pool.settle(ticket, ready=True, agent_used=ready_row.agent_used)
            await self._apply_settlement(rt, ticket, decision, ready_row, queue_ms, create_ms)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            settled = True
            rt.pool.settle(ticket, ready=False)
            self._fail_waiter(rt, ticket, exc)
            if sandbox_id is not None:
                await self._fail_create(rt, sandbox_id, exc, sent=sent)
        finally:
            if not settled:
                rt.pool.settle(ticket, ready=False)
                self._fail_waiter(rt, ticket, ControllerUnavailable("the controller is stopping"))
                if sandbox_id is not None and not self._stopping:
                    self._spawn(self._delete_sandbox(rt, sandbox_id, reason="create_cancelled"), rt)
            rt.waiters.pop(ticket.ticket_id, None)
            rt.notify()

    def _spec(
        self, rt: JobRuntime, ticket: CreateTicket, row: Any, owner: OwnerRef | None = None
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
        )

    async def _apply_settlement(
        self,
        rt: JobRuntime,
        ticket: CreateTicket,
        decision: Settle,
        row: Any,
        queue_ms: float,
        create_ms: float,
    ) -> None:
        if decision is Settle.HAND_OUT:
            await self._db_now(
                sandbox_hand_out,
                sandbox_id=row.pk,
                source=SandboxSource.CREATED.value,
                role=ticket.role,
                now=self._now(),
            )
            rt.pool.hand_out(row.pk, ticket.key)
            waiter = rt.waiters.get(ticket.ticket_id)
            if ticket.abandoned or waiter is None or waiter.done():
                # The acquire gave up during the hand-out write: the pod carries the
                # agent mark, so it is deleted, never made warm (Table 2, row 1).
                rt.pool.forget(row.pk)
                self._spawn(self._delete_sandbox(rt, row.pk, reason="late_after_hand_out"), rt)
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
        elif decision is Settle.WARM:
            rt.refs[row.pk] = SandboxRef.of(row)
            rt.pool.add_warm(
                WarmPod(sandbox_id=row.pk, key=ticket.key, since=self._clock(), role=ticket.role)
            )
            late = ticket.purpose is Purpose.ACQUIRE
            await self._db(
                sandbox_record_event,
                sandbox_id=row.pk,
                kind=events.WARM,
                now=self._now(),
                detail={"late": late, "create_ms": round(create_ms, 3)},
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
            await self._delete_sandbox(
                rt, row.pk, reason=reason, kind=events.DRAINED if draining else ""
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
        extra = getattr(exc, "extra", None) or {}
        status = extra.get("status", 0) if isinstance(extra, dict) else 0
        try:
            if not sent:
                # Never sent: nothing on the backend to delete.
                await self._db(
                    sandbox_mark_gone, sandbox_id=sandbox_id, reason=reason, now=self._now()
                )
                return
            await self._db(
                sandbox_fail,
                sandbox_id=sandbox_id,
                reason=reason,
                now=self._now(),
                detail={"status": status},
            )
            if isinstance(exc, ProviderConflict):
                # Another workload holds the name: never touch its pod (window 25).
                await self._db(
                    sandbox_mark_gone, sandbox_id=sandbox_id, reason=reason, now=self._now()
                )
                return
        except SandmanError:
            log.warning("recording the failed create of %s failed", sandbox_id, exc_info=True)
        await self._delete_sandbox(rt, sandbox_id, reason="create_failed")
