"""Acquire: a warm hand-out after a health check, or a wait on an owned create.

Ordering rules a reader must not break (paper §4.4, Table 2 row 1, Appendix F):
* The acquire never runs a create itself: it admits a ticket, spawns the create as a task
  the controller owns (``creates.py``) and awaits a future. On timeout or cancellation it
  marks the ticket ``abandoned`` and leaves; the create settles on its own.
* A warm pod is handed out only after its health check (``warm.py``).
* Refusals (``PoolCapReached``) happen before any sandbox row or create exists.
* The acquisition row is opened (``pending``, through the batcher) when the acquire starts
  and committed before the acquire hands anything out or admits a create; a warm pod's
  health check runs meanwhile. Every finish updates that row, so an acquire in flight when
  the service dies is on record and the next controller ends it ``failed`` with the reason
  ``service_restarted`` (``reconcile.py``). The row keeps the REST call's
  ``Idempotency-Key`` and the ticket carries its id, so the hand-out names the sandbox on
  it: a retry after a restart gets that sandbox (``services/recovery.py``).
* The wait for a create runs on the controller's injected ``sleep``: with the real
  ``asyncio.sleep`` it is ``asyncio.wait_for``; with a fake clock a test expires an acquire
  timeout by advancing the clock once the window it wants is held by a gate (Table A21,
  windows 4, 10-14 and 18), never by a timer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.db import InterfaceError, OperationalError

from sandboxes import events
from sandboxes.addresses import AddressFloorReached
from sandboxes.controller.batcher import WriteBatcher
from sandboxes.controller.creates import CreateRunner
from sandboxes.controller.deletes import Deleter
from sandboxes.controller.offers import Offers
from sandboxes.controller.runtime import AcquireResult, CreateOutcome, JobRuntime
from sandboxes.controller.runtimes import Runtimes
from sandboxes.controller.state import ControllerState
from sandboxes.controller.tasks import AcquireGate, TaskOwner
from sandboxes.controller.warm import WarmHandOut
from sandboxes.imagerefs import tag_refusal
from sandboxes.pool import CreateTicket, PoolKey, Purpose
from sandboxes.services import acquisition_record, sandbox_record_event
from sandboxes.states import AcquisitionOutcome, JobState, Role, SandboxSource
from sandman_site.errors import (
    AcquireTimeout,
    ControllerUnavailable,
    ImageNotPinned,
    InvalidInput,
    JobNotActive,
    NotFound,
    PoolCapReached,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
FINISH_RETRIES = 40  # about three minutes of backoff


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
    never_used: bool = False  # no checked-reuse pod (a shadow grading's sandbox)
    idempotency_key: str = ""  # the REST call's key: kept on the acquisition row

    @classmethod
    def build(cls, **kwargs: Any) -> AcquireRequest:
        request = cls(**kwargs)
        if request.role not in Role.values:
            raise InvalidInput(f"role must be one of {', '.join(Role.values)}")
        if not request.image or len(request.image) > 512:
            raise InvalidInput("image must be 1–512 characters")
        if request.base_commit is not None and len(request.base_commit) > 64:
            raise InvalidInput("base_commit is longer than 64 characters")
        for value, name in (
            (request.cpu_millis, "cpu_millis"),
            (request.memory_bytes, "memory_bytes"),
        ):
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
    (AddressFloorReached, AcquisitionOutcome.ADDRESS_FLOOR),
    (asyncio.CancelledError, AcquisitionOutcome.CANCELLED),
    (ControllerUnavailable, AcquisitionOutcome.CANCELLED),
]


class Acquirer:
    """Answers acquires: a warm pod, or the outcome of a create the controller owns."""

    def __init__(
        self,
        state: ControllerState,
        tasks: TaskOwner,
        gate: AcquireGate,
        runtimes: Runtimes,
        creates: CreateRunner,
        deleter: Deleter,
        warm: WarmHandOut,
        batcher: WriteBatcher,
        offers: Offers,
    ) -> None:
        self._state = state
        self._offers = offers
        self._batcher = batcher
        self._tasks = tasks
        self._gate = gate
        self._runtimes = runtimes
        self._creates = creates
        self._deleter = deleter
        self._warm = warm

    async def acquire(self, req: AcquireRequest) -> AcquireResult:
        state = self._state
        t0 = state.clock()
        started_at = state.now()
        rt = self._runtimes.cached(req.job_id)
        if rt is None:
            info = await self._runtimes.first_info(req.job_id)
            if info is None:
                raise NotFound(f"job {req.job_id} does not exist")
            if info.state != JobState.ACTIVE:
                raise JobNotActive(f"job {req.job_id} is {info.state}; it takes no acquires")
            rt = await self._runtimes.get(req.job_id, info)
        if rt.pool.draining:
            raise JobNotActive(f"job {req.job_id} is draining; it takes no acquires")
        if req.role == Role.GRADING and rt.info.reuse_enabled and not rt.info.reuse_allow_tags:
            refused = tag_refusal(req.image, req.base_commit, backend=state.backend, use="reused")
            if refused is not None:
                raise ImageNotPinned(refused, {"image": req.image})
        key = req.key
        record = {
            "job_id": req.job_id,
            "user_id": req.user_id,
            "role": req.role,
            "image": req.image,
            "key_hash": key.hash,
            "started_at": started_at,
            "idempotency_key": req.idempotency_key,
        }
        opened = self._tasks.spawn(
            self._batcher.open_acquisition(record), name=f"open-acquisition-{req.job_id}"
        )
        self._gate.started()
        try:
            return await self._recorded(rt, req, key, t0, record, opened)
        finally:
            self._gate.ended()

    async def _recorded(
        self,
        rt: JobRuntime,
        req: AcquireRequest,
        key: PoolKey,
        t0: float,
        record: dict[str, Any],
        opened: asyncio.Task[int],
    ) -> AcquireResult:
        """The acquire in the pool, and its acquisition row whatever the outcome."""
        state, tasks = self._state, self._tasks
        try:
            result, recorded = await self._in_pool(rt, req, key, t0, record, opened)
        except BaseException as exc:
            outcome = next(
                (o for klass, o in _OUTCOMES if isinstance(exc, klass)), AcquisitionOutcome.FAILED
            )
            write = tasks.spawn(
                self._finish_failed(
                    opened,
                    {
                        **record,
                        "outcome": outcome,
                        "now": state.now(),
                        "wait_ms": (state.clock() - t0) * 1000.0,
                        "detail": f"{type(exc).__name__}: {exc}",
                    },
                ),
                name=f"record-acquisition-{req.job_id}",
            )
            if not isinstance(exc, asyncio.CancelledError):
                await asyncio.shield(write)
            raise
        if not recorded:
            finished = {
                **record,
                "acquisition_id": opened.result(),  # awaited before the create was admitted
                "outcome": AcquisitionOutcome.OK,
                "now": state.now(),
                "sandbox_id": result.sandbox_id,
                "source": result.source,
                "queue_ms": result.queue_ms,
                "create_ms": result.create_ms,
                "wait_ms": result.wait_ms,
            }
            # Batched with the other acquires' rows written meanwhile (batcher.py).
            try:
                await asyncio.shield(tasks.spawn(self._batcher.acquisition(finished, urgent=True)))
            except (OperationalError, InterfaceError):
                # The sandbox is handed out (committed): it is the caller's whatever happens
                # to this second write, so the answer goes out and the row is finished later.
                log.warning("acquisition row of sandbox %s: database lost", result.sandbox_id)
                tasks.spawn(
                    self._finish_later(lambda: self._batcher.acquisition(finished), record),
                    name=f"finish-acquisition-{req.job_id}",
                )
        return result

    async def _finish_later(
        self, write: Callable[[], Awaitable[None]], record: dict[str, Any]
    ) -> None:
        """Retry a finish until the database is back (or the controller stops)."""
        delay = 0.1
        for _ in range(FINISH_RETRIES):
            await self._state.sleep(delay)
            try:
                await write()
                return
            except (OperationalError, InterfaceError):
                delay = min(delay * 2, 5.0)
        log.error("an acquisition of job %s is left pending", record["job_id"])

    async def _finish_failed(self, opened: asyncio.Task[int], finished: dict[str, Any]) -> None:
        """End the open row with the failure (inserted instead if it could not be opened)."""
        try:
            acquisition_id: int | None = await asyncio.shield(opened)
        except Exception:
            log.warning("acquisition row of job %s not opened", finished["job_id"], exc_info=True)
            acquisition_id = None

        async def write() -> None:
            await self._tasks.db(acquisition_record, **finished, acquisition_id=acquisition_id)

        try:
            await write()
        except (OperationalError, InterfaceError):
            if acquisition_id is None:
                raise  # nothing on record to finish later
            log.warning("acquisition %s: database lost, finished later", acquisition_id)
            self._tasks.spawn(self._finish_later(write, finished), name="finish-acquisition")

    async def _in_pool(
        self,
        rt: JobRuntime,
        req: AcquireRequest,
        key: PoolKey,
        t0: float,
        record: dict[str, Any],
        opened: asyncio.Task[int],
    ) -> tuple[AcquireResult, bool]:
        """The sandbox and whether its acquisition row was already written (warm path)."""
        deadline = None if req.timeout_s is None else t0 + req.timeout_s
        rt.pool.note_request(key)
        rt.key_roles.setdefault(key, req.role)
        while (pod := await self._take_warm(rt, req, key)) is not None:
            result = await self._warm.try_hand_out(rt, pod, req.role, t0, deadline, record, opened)
            if result is not None:
                self._creates.fill(rt)
                return result, True
        self._state.addresses.check()  # under the address floor: refused before any create
        await asyncio.shield(opened)  # the row is on record before a create is admitted
        # At the cap, an offered pod of another key is evicted as a warm one would be; no
        # await between its withdraw and the admission that evicts it.
        await self._offers.make_room(rt, key)
        admission = rt.pool.admit(key, purpose=Purpose.ACQUIRE, role=req.role)
        if admission.ticket is None:
            raise PoolCapReached(
                f"job {rt.job_id} holds {rt.pool.live_count} live sandboxes "
                f"(max_live {rt.info.max_live}) and none is warm for this key",
                {"live": rt.pool.live_count, "max_live": rt.info.max_live},
            )
        if admission.evicted is not None:
            self._tasks.spawn(
                self._deleter.delete_sandbox(
                    rt, admission.evicted.sandbox_id, reason="evicted", kind=events.EVICTED
                ),
                rt,
            )
        ticket = admission.ticket
        ticket.acquisition_id = opened.result()  # linked to the sandbox by the hand-out
        waiter: asyncio.Future[CreateOutcome] = asyncio.get_running_loop().create_future()
        rt.waiters[ticket.ticket_id] = waiter
        self._tasks.spawn(
            self._creates.create(rt, ticket), rt, name=f"create-{rt.job_id}-{ticket.ticket_id}"
        )
        self._creates.fill(rt)
        out = await self._wait_for_create(rt, req, ticket, waiter, deadline)
        result = AcquireResult(
            sandbox_id=out.sandbox_id,
            name=out.name,
            address=out.address,
            token=out.token,
            source=SandboxSource.CREATED.value,
            wait_ms=(self._state.clock() - t0) * 1000.0,
            queue_ms=out.queue_ms,
            create_ms=out.create_ms,
        )
        return result, False

    async def _take_warm(self, rt: JobRuntime, req: AcquireRequest, key: PoolKey) -> Any:
        """A warm pod of the controller's, else one of its offers withdrawn (offers.py)."""
        pod = rt.pool.take_warm(key, req.role, never_used=req.never_used)
        if pod is None:
            pod = await self._offers.take(rt, key)
        return pod

    async def _wait_for_create(
        self,
        rt: JobRuntime,
        req: AcquireRequest,
        ticket: CreateTicket,
        waiter: asyncio.Future[CreateOutcome],
        deadline: float | None,
    ) -> CreateOutcome:
        """The create's outcome by ``deadline``; else the ticket is abandoned to the pool."""
        state = self._state
        try:
            remaining = None if deadline is None else max(0.0, deadline - state.clock())
            return await await_deadline(waiter, remaining, state.sleep)  # injected clock
        except TimeoutError:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                return waiter.result()
            _abandon(rt, ticket, waiter)
            if ticket.sandbox_id is not None:  # the late create's timeline says why
                self._tasks.spawn(
                    self._tasks.db(
                        sandbox_record_event,
                        sandbox_id=ticket.sandbox_id,
                        kind=events.ACQUIRE_TIMEOUT,
                        now=state.now(),
                        detail={"timeout_s": req.timeout_s},
                    ),
                    rt,
                )
            if waiter.done() and not waiter.cancelled():
                failure = waiter.exception()
                if failure is not None:
                    raise failure from None
            raise AcquireTimeout(
                f"no sandbox within {req.timeout_s:g} s; the pool keeps the create",
                {"timeout_s": req.timeout_s},
            ) from None
        except asyncio.CancelledError:
            _abandon(rt, ticket, waiter)
            raise


def _abandon(rt: JobRuntime, ticket: CreateTicket, waiter: asyncio.Future[CreateOutcome]) -> None:
    rt.pool.abandon(ticket)
    rt.waiters.pop(ticket.ticket_id, None)
    if not waiter.done():
        waiter.cancel()


async def await_deadline(
    waiter: asyncio.Future[T],
    remaining: float | None,
    sleep: Callable[[float], Awaitable[None]],
) -> T:
    """``waiter``'s result (never cancelling it), or ``TimeoutError`` after ``remaining``
    seconds on ``sleep`` (the controller's injected one)."""
    if remaining is None or sleep is asyncio.sleep:
        return await asyncio.wait_for(asyncio.shield(waiter), remaining)
    timer = asyncio.ensure_future(sleep(remaining))
    either: set[asyncio.Future[Any]] = {waiter, timer}
    try:
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    finally:
        timer.cancel()
    if waiter.done():
        return waiter.result()
    raise TimeoutError
