"""Acquire: a warm hand-out after a health check, or a wait on an owned create.

Ordering rules a reader must not break (paper §4.4, Table 2 row 1, Appendix F):
* The acquire never runs a create itself: it admits a ticket, spawns the create as a task
  the controller owns (``creates.py``) and awaits a future. On timeout or cancellation it
  marks the ticket ``abandoned`` and leaves; the create settles on its own.
* A warm pod is taken into ``checking`` before its health check, handed out only if the
  check passes, put back if the caller left before anything changed, and deleted if it
  failed the check or the caller left during the hand-out write (it carries the agent
  mark then).
* Refusals (``PoolCapReached``) happen before any row or create exists.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from sandboxes import events
from sandboxes.controller import queries
from sandboxes.controller.runtime import AcquireResult, CreateOutcome, JobRuntime, SandboxRef
from sandboxes.pool import CreateTicket, PoolKey, Purpose, WarmPod
from sandboxes.providers.base import Handle
from sandboxes.services import (
    acquisition_record,
    sandbox_hand_out,
    sandbox_mark_healthy,
    sandbox_record_event,
)
from sandboxes.states import AcquisitionOutcome, JobState, Role, SandboxSource, SandboxState
from sandman_site.errors import (
    AcquireTimeout,
    ControllerUnavailable,
    InvalidInput,
    InvalidTransition,
    JobNotActive,
    NotFound,
    PoolCapReached,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AcquireRequest:
    job_id: int
    image: str
    base_commit: str | None
    cpu_millis: int
    memory_bytes: int
    workspace_bytes: int | None
    role: str
    timeout_s: float | None
    user_id: int | None = None

    @classmethod
    def build(cls, **kwargs: Any) -> AcquireRequest:
        request = cls(**kwargs)
        if request.role not in Role.values:
            raise InvalidInput(f"role must be one of {', '.join(Role.values)}")
        if not request.image or len(request.image) > 512:
            raise InvalidInput("image must be 1–512 characters")
        if request.base_commit is not None and len(request.base_commit) > 64:
            raise InvalidInput("base_commit is longer than 64 characters")
        for name in ("cpu_millis", "memory_bytes"):
            value = getattr(request, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise InvalidInput(f"{name} must be a positive integer")
        ws = request.workspace_bytes
        if ws is not None and (not isinstance(ws, int) or isinstance(ws, bool) or ws <= 0):
            raise InvalidInput("workspace_bytes must be a positive integer")
        if request.timeout_s is not None and not (0 < request.timeout_s <= 86400):
            raise InvalidInput("timeout_s must be between 0 and 86400 seconds")
        return request

    @property
    def key(self) -> PoolKey:
        return PoolKey(
            image=self.image,
            base_commit=self.base_commit or None,
            cpu_millis=self.cpu_millis,
            memory_bytes=self.memory_bytes,
            workspace_bytes=self.workspace_bytes,
        )


_OUTCOMES: list[tuple[type[BaseException], str]] = [
    (AcquireTimeout, AcquisitionOutcome.TIMEOUT),
    (PoolCapReached, AcquisitionOutcome.CAP),
    (asyncio.CancelledError, AcquisitionOutcome.CANCELLED),
    (ControllerUnavailable, AcquisitionOutcome.CANCELLED),
]


class AcquireMixin:
    """Acquire path of :class:`sandboxes.controller.core.Controller`."""

    # -- the acquire ------------------------------------------------------------------------
    async def _acquire(self, req: AcquireRequest) -> AcquireResult:
        t0 = self._clock()
        started_at = self._now()
        rt = self._runtimes.get(req.job_id)
        if rt is None:
            info = await self._db_now(queries.job_info, req.job_id)
            if info is None:
                raise NotFound(f"job {req.job_id} does not exist")
            if info.state != JobState.ACTIVE:
                raise JobNotActive(f"job {req.job_id} is {info.state}; it takes no acquires")
            rt = await self._runtime(req.job_id, info)
        if rt.pool.draining:
            raise JobNotActive(f"job {req.job_id} is draining; it takes no acquires")
        key = req.key
        record = {
            "job_id": req.job_id,
            "user_id": req.user_id,
            "role": req.role,
            "image": req.image,
            "key_hash": key.hash,
            "started_at": started_at,
        }
        self._acquire_started()
        try:
            return await self._acquire_recorded(rt, req, key, t0, record)
        finally:
            self._acquire_ended()

    async def _acquire_recorded(
        self,
        rt: JobRuntime,
        req: AcquireRequest,
        key: PoolKey,
        t0: float,
        record: dict[str, Any],
    ) -> AcquireResult:
        """The acquire in the pool, and its acquisition row whatever the outcome."""
        try:
            result, recorded = await self._acquire_in_pool(rt, req, key, t0, record)
        except BaseException as exc:
            outcome = next(
                (o for klass, o in _OUTCOMES if isinstance(exc, klass)), AcquisitionOutcome.FAILED
            )
            write = self._spawn(
                self._db(
                    acquisition_record,
                    **record,
                    outcome=outcome,
                    now=self._now(),
                    wait_ms=(self._clock() - t0) * 1000.0,
                    detail=f"{type(exc).__name__}: {exc}",
                ),
                name=f"record-acquisition-{req.job_id}",
            )
            if not isinstance(exc, asyncio.CancelledError):
                await asyncio.shield(write)
            raise
        if not recorded:
            await asyncio.shield(
                self._spawn(
                    self._db_now(
                        acquisition_record,
                        **record,
                        outcome=AcquisitionOutcome.OK,
                        now=self._now(),
                        sandbox_id=result.sandbox_id,
                        source=result.source,
                        queue_ms=result.queue_ms,
                        create_ms=result.create_ms,
                        wait_ms=result.wait_ms,
                    )
                )
            )
        return result

    async def _acquire_in_pool(
        self,
        rt: JobRuntime,
        req: AcquireRequest,
        key: PoolKey,
        t0: float,
        record: dict[str, Any],
    ) -> tuple[AcquireResult, bool]:
        """The sandbox and whether its acquisition row was already written (warm path)."""
        deadline = None if req.timeout_s is None else t0 + req.timeout_s
        rt.pool.note_request(key)
        rt.key_roles.setdefault(key, req.role)
        while (pod := rt.pool.take_warm(key, req.role)) is not None:
            result = await self._try_warm(rt, pod, req, t0, deadline, record)
            if result is not None:
                self._fill(rt)
                return result, True
        admission = rt.pool.admit(key, purpose=Purpose.ACQUIRE, role=req.role)
        if admission.ticket is None:
            raise PoolCapReached(
                f"job {rt.job_id} holds {rt.pool.live_count} live sandboxes "
                f"(max_live {rt.info.max_live}) and none is warm for this key",
                {"live": rt.pool.live_count, "max_live": rt.info.max_live},
            )
        if admission.evicted is not None:
            self._spawn(
                self._delete_sandbox(
                    rt, admission.evicted.sandbox_id, reason="evicted", kind=events.EVICTED
                ),
                rt,
            )
        ticket = admission.ticket
        waiter: asyncio.Future[CreateOutcome] = asyncio.get_running_loop().create_future()
        rt.waiters[ticket.ticket_id] = waiter
        self._spawn(self._create(rt, ticket), rt, name=f"create-{rt.job_id}-{ticket.ticket_id}")
        self._fill(rt)
        try:
            remaining = None if deadline is None else max(0.0, deadline - self._clock())
            out = await self._await_deadline(waiter, remaining)  # injected clock
        except TimeoutError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                out = waiter.result()
            else:
                self._abandon(rt, ticket, waiter)
                if ticket.sandbox_id is not None:  # the late create's timeline says why
                    self._spawn(
                        self._db(
                            sandbox_record_event,
                            sandbox_id=ticket.sandbox_id,
                            kind=events.ACQUIRE_TIMEOUT,
                            now=self._now(),
                            detail={"timeout_s": req.timeout_s},
                        ),
                        rt,
                    )
                if waiter.done() and not waiter.cancelled() and waiter.exception() is not None:
                    raise waiter.exception() from None
                raise AcquireTimeout(
                    f"no sandbox within {req.timeout_s:g} s; the pool keeps the create",
                    {"timeout_s": req.timeout_s},
                ) from None
        except asyncio.CancelledError:
            self._abandon(rt, ticket, waiter)
            raise
        result = AcquireResult(
            sandbox_id=out.sandbox_id,
            name=out.name,
            address=out.address,
            token=out.token,
            source=SandboxSource.CREATED.value,
            wait_ms=(self._clock() - t0) * 1000.0,
            queue_ms=out.queue_ms,
            create_ms=out.create_ms,
        )
        return result, False

    def _abandon(
        self, rt: JobRuntime, ticket: CreateTicket, waiter: asyncio.Future[CreateOutcome]
    ) -> None:
        rt.pool.abandon(ticket)
        rt.waiters.pop(ticket.ticket_id, None)
        if not waiter.done():
            waiter.cancel()

    async def _try_warm(
        self,
        rt: JobRuntime,
        pod: WarmPod,
        req: AcquireRequest,
        t0: float,
        deadline: float | None,
        record: dict[str, Any],
    ) -> AcquireResult | None:
        """Health-check one warm pod and hand it out; None if it was not usable.

        One database commit on success: the hand-out and its acquisition row together.
        """
        sid = pod.sandbox_id
        handed = False
        try:
            ref = rt.refs.get(sid)
            if ref is None:  # not cached (should not happen): read the row
                row = await self._db(queries.sandbox_row, sid)
                if row is None or row.state != SandboxState.READY:
                    rt.pool.forget(sid)
                    handed = True
                    return None
                ref = rt.refs[sid] = SandboxRef.of(row)
            budget = self.health_timeout_s
            if deadline is not None:
                budget = max(0.05, min(budget, deadline - self._clock()))
            handle = Handle(ref.name, ref.nonce, ref.backend, ref.uid, ref.ref)
            try:
                healthy = await asyncio.wait_for(
                    self.provider.health(handle, ref.address, ref.token), budget
                )
            except TimeoutError:
                healthy = False
            if not healthy:
                rt.pool.forget(sid)
                handed = True  # it is no longer ours to put back
                await self._db(sandbox_mark_healthy, sandbox_id=sid, now=self._now(), healthy=False)
                self._spawn(self._delete_sandbox(rt, sid, reason="health_failed"), rt)
                return None
            source = (SandboxSource.REUSED if pod.reused else SandboxSource.WARM).value
            checked_at = self._now()
            wait_ms = (self._clock() - t0) * 1000.0
            write = self._spawn(
                self._db_now(
                    sandbox_hand_out,
                    sandbox_id=sid,
                    source=source,
                    role=req.role,
                    now=checked_at,
                    healthy_at=checked_at,
                    acquisition={
                        **record,
                        "outcome": AcquisitionOutcome.OK.value,
                        "queue_ms": 0.0,
                        "wait_ms": wait_ms,
                    },
                ),
                rt,
            )
            handed = True
            try:
                await asyncio.shield(write)
            except asyncio.CancelledError:
                # The caller left during the write: the pod carries the agent mark now.
                self._spawn(self._delete_after(rt, write, sid, "abandoned_hand_out"), rt)
                raise
            except InvalidTransition:
                # Taken from us meanwhile (a drain deletes pods being checked): not usable.
                rt.pool.forget(sid)
                if rt.pool.draining:
                    raise JobNotActive(f"job {rt.job_id} is draining") from None
                return None
            rt.pool.hand_out(sid, pod.key)
            rt.refs.pop(sid, None)
            return AcquireResult(
                sandbox_id=sid,
                name=ref.name,
                address=ref.address,
                token=ref.token,
                source=source,
                wait_ms=wait_ms,
                queue_ms=0.0,
            )
        finally:
            if not handed and sid in rt.pool.checking:
                # Cancelled before anything changed: the pod is still a clean warm pod.
                rt.pool.add_warm(pod)

    async def _delete_after(
        self, rt: JobRuntime, write: asyncio.Task[Any], sandbox_id: int, reason: str
    ) -> None:
        try:
            await write
        except Exception:
            log.warning("hand-out write of sandbox %s failed", sandbox_id, exc_info=True)
        rt.pool.forget(sandbox_id)
        await self._delete_sandbox(rt, sandbox_id, reason=reason)
