"""The controller's side of the direct hand-out: offer warm pods, follow claims, withdraw.

With ``SANDMAN_DIRECT_HANDOUT`` on PostgreSQL, an acquire claims an offered warm pod in the
database itself (``sandboxes/services/offers.py``, called by ``sandboxes/apis/direct.py``)
and asks the controller only when none is offered. This collaborator keeps the pool books
true to what the claims did:

* **offer**: never-used warm pods leave the ``warm`` book for ``offered`` and their rows
  are stamped (:meth:`Offers.offer`, after every pod that becomes warm and at each
  maintenance round); a stamp that fails puts the pods back to ``warm``.
* **follow**: a claim's notification (one LISTEN connection in the ``sandman-offers``
  thread, handed to the loop) moves the pod ``offered`` → ``in_use``, counts as a request
  of its key and starts the replacement build; an ``unhealthy`` one forgets and deletes
  the pod. Each maintenance round also reads the offered rows that are no longer offered
  (:meth:`Offers.round`), so a notification lost to a dropped connection is followed
  within a round.
* **withdraw** before the controller acts on an offered pod itself: its own acquires
  (:meth:`Offers.take`: a keyed recovery, a grading, a sync caller whose key has only
  offered pods) and idle trims (withdrawn to ``warm``, then trimmed as usual). What a
  claimant won first is followed instead. Drains delete offered pods like every other
  pod of the job (a claimant may hand one out until the job's ``draining`` commit; the
  drain then deletes it in use, as it does every in-use pod).
* A controller that starts clears every offer before its reconcile reads the rows.

Not offered: checked-reuse pods (they serve one role, as ``reused``). Off (the default,
and always on SQLite, which has no ``SKIP LOCKED``): nothing here runs.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable

from django.conf import settings
from django.db import InterfaceError, OperationalError, connection

from sandboxes.controller.creates import CreateRunner
from sandboxes.controller.deletes import Deleter
from sandboxes.controller.runtime import JobRuntime
from sandboxes.controller.runtimes import Runtimes
from sandboxes.controller.state import ControllerState
from sandboxes.controller.tasks import AcquireGate, TaskOwner
from sandboxes.pool import PoolKey, WarmPod
from sandboxes.services.deletes import DeleteOrder
from sandboxes.services.offers import (
    CHANNEL,
    database_conninfo,
    offers_gone,
    rows_not_in,
    sandbox_clear_offers,
    sandbox_offer_many,
    sandbox_withdraw_offers,
)
from sandboxes.states import SandboxState

log = logging.getLogger(__name__)
LISTEN_RETRY_S = 1.0  # a lost LISTEN connection is opened again after this backoff
# A web worker's claim or release counts as an acquire in flight this long after the
# controller hears of it, so the background work it causes (the replacement build, the
# release's delete) waits for a burst to pass, as it does for the controller's own
# acquires (tasks.AcquireGate, bounded by its yield_s).
BURST_QUIET_S = 0.05


def direct_handout_enabled() -> bool:
    """The setting, on PostgreSQL only."""
    return bool(settings.SANDMAN_DIRECT_HANDOUT) and connection.vendor == "postgresql"


class Offers:
    """Offers warm pods to the web workers and keeps the books true to their claims."""

    def __init__(
        self,
        state: ControllerState,
        tasks: TaskOwner,
        runtimes: Runtimes,
        creates: CreateRunner,
        deleter: Deleter,
        gate: AcquireGate,
    ) -> None:
        self._state = state
        self._gate = gate
        self._tasks = tasks
        self._runtimes = runtimes
        self._creates = creates
        self._deleter = deleter
        self.enabled = direct_handout_enabled()
        self._listener: Listener | None = None

    # -- start and stop -------------------------------------------------------------------
    async def clear(self) -> int:
        """Every offer withdrawn (a starting controller, before its reconcile reads)."""
        if not self.enabled:
            return 0
        return await self._tasks.db(sandbox_clear_offers)

    def start(self) -> None:
        """Listen for claims, then offer every job's warm pods (loop thread)."""
        if not self.enabled:
            return
        if self._listener is None:
            self._listener = Listener(self._state.loop, self.on_notify)
            self._listener.start()
        for rt in self._runtimes.all():
            self.offer(rt)

    async def stop(self) -> None:
        """Stop listening (the thread is joined off the loop: it wakes within 0.5 s)."""
        listener, self._listener = self._listener, None
        if listener is not None:
            await asyncio.to_thread(listener.stop)

    # -- offer ----------------------------------------------------------------------------
    def offer(self, rt: JobRuntime) -> None:
        """Offer the job's never-used warm pods (an owned task stamps their rows)."""
        if not self.enabled or self._state.stopping:
            return
        pods = rt.pool.offer_all()
        if pods:
            self._tasks.spawn(self._stamp(rt, pods), rt, name=f"offer-{rt.job_id}")

    async def _stamp(self, rt: JobRuntime, pods: list[WarmPod]) -> None:
        try:
            stamped = set(
                await self._tasks.db(
                    sandbox_offer_many,
                    sandbox_ids=[p.sandbox_id for p in pods],
                    now=self._state.now(),
                )
            )
        except (OperationalError, InterfaceError):
            # The stamp may have committed with its answer lost: the pods stay offered in
            # the books, and the next round's read deletes those whose rows are not
            # (a warm pod wasted, never one handed out twice).
            log.warning("offering %d warm pods of job %s failed", len(pods), rt.job_id)
            stamped = {pod.sandbox_id for pod in pods}
        rt.pool.stamped(pods, stamped)  # the rest are the controller's warm pods again

    # -- follow ---------------------------------------------------------------------------
    def on_notify(self, payload: str) -> None:
        """A web worker's notification (loop thread): ``claimed:JOB:SANDBOX``,
        ``unhealthy:JOB:SANDBOX`` or ``released:JOB:SANDBOX:ORDER`` (the delete's order as
        JSON, empty when there is nothing on the backend to delete)."""
        try:
            what, job, sandbox, *rest = payload.split(":", 3)
            job_id, sandbox_id = int(job), int(sandbox)
            order = DeleteOrder(**json.loads(rest[0])) if rest and rest[0] else None
        except (ValueError, TypeError):
            log.warning("offer notification not understood: %r", payload)
            return
        rt = self._runtimes.cached(job_id)
        if rt is None:
            return
        self._gate.started()  # a burst's claims and releases hold background work back
        self._state.loop.call_later(BURST_QUIET_S, self._gate.ended)
        if what == "released":
            self._released(rt, sandbox_id, order)
            return
        state = SandboxState.IN_USE if what == "claimed" else SandboxState.READY
        self._follow(rt, sandbox_id, state, reason="health_failed")

    def _released(self, rt: JobRuntime, sandbox_id: int, order: DeleteOrder | None) -> None:
        """A web worker released a sandbox (its ``PendingDelete`` committed): out of the
        books, and the delete sent as the controller's own release sends it."""
        rt.pool.forget(sandbox_id)
        rt.refs.pop(sandbox_id, None)
        if order is not None and not self._state.stopping:
            self._tasks.spawn(self._deleter.destroy_later(order), rt, name=f"release-{sandbox_id}")
        self._creates.fill(rt)

    def _follow(self, rt: JobRuntime, sandbox_id: int, state: str, *, reason: str) -> None:
        """The books after an offered row moved to ``state`` behind them: ``in_use`` (a
        claimant won it), ``ready`` but no longer offered (a claimant found it unhealthy,
        or a withdraw whose answer was lost: deleted with ``reason`` either way), or a
        state the controller itself wrote (forgotten)."""
        if state == SandboxState.IN_USE:
            key = rt.pool.claimed(sandbox_id)
            if key is None and sandbox_id in rt.pool.checking:  # our own take lost the race
                key = rt.pool.checking[sandbox_id]
                rt.pool.hand_out(sandbox_id, key)
                rt.pool.note_request(key)
            if key is not None:
                rt.refs.pop(sandbox_id, None)
                self._creates.fill(rt)
            return
        known = sandbox_id in rt.pool.offered or sandbox_id in rt.pool.checking
        rt.pool.forget(sandbox_id)
        rt.refs.pop(sandbox_id, None)
        if known and state in (SandboxState.READY, SandboxState.FAILED):
            self._tasks.spawn(self._deleter.delete_sandbox(rt, sandbox_id, reason=reason), rt)

    # -- withdraw -------------------------------------------------------------------------
    async def take(self, rt: JobRuntime, key: PoolKey) -> WarmPod | None:
        """An offered pod of ``key`` withdrawn for the controller's own hand-out (in the
        ``checking`` book, as ``take_warm`` leaves one), or None."""
        if not self.enabled:
            return None
        while (pod := rt.pool.take_offered(key)) is not None:
            if await self._withdraw_taken(rt, pod):
                return pod
        return None

    async def make_room(self, rt: JobRuntime, key: PoolKey) -> None:
        """Before an acquire's admission at ``max_live``: the offer of the pod the
        admission would evict (``pool.take_offered_to_evict``) taken back, so the pod is
        the controller's warm pod again and the admission evicts it, as it evicts its
        own. An offer a claimant won meanwhile is followed, and the next one tried."""
        if not self.enabled:
            return
        while (pod := rt.pool.take_offered_to_evict(key)) is not None:
            if await self._withdraw_taken(rt, pod):
                rt.pool.withdrawn(pod)
                return

    async def _withdraw_taken(self, rt: JobRuntime, pod: WarmPod) -> bool:
        """Withdraw the offer of a pod the books just took out of ``offered`` (into
        ``checking``): True if this won it; else the claim or state that beat it is
        followed. Raised: offered again in the books (the next round reads the row)."""
        try:
            won, others = await self._tasks.db_now(
                sandbox_withdraw_offers, sandbox_ids=[pod.sandbox_id]
            )
        except BaseException:
            rt.pool.offer_back(pod)
            raise
        if won:
            return True
        state = others.get(pod.sandbox_id, SandboxState.DELETED)
        self._follow(rt, pod.sandbox_id, state, reason="offer_lost")
        return False

    async def round(self) -> int:
        """Maintenance: follow what notifications missed, withdraw idle offers (the trim
        that follows deletes them), offer what is warm. Returns the pods followed."""
        if not self.enabled:
            return 0
        followed = 0
        for rt in self._runtimes.all():
            if rt.pool.in_use:  # released by a web worker, its notification lost
                left = await self._tasks.db(
                    rows_not_in, sandbox_ids=list(rt.pool.in_use), state=SandboxState.IN_USE
                )
                for sandbox_id, state in left.items():
                    # Deleting or gone only: a kept grading pod (``released``) is the
                    # releaser's, moved to ``checking`` by it.
                    ended = state in (SandboxState.DELETING, SandboxState.DELETED)
                    if ended and sandbox_id in rt.pool.in_use:
                        rt.pool.forget(sandbox_id)
                        rt.refs.pop(sandbox_id, None)
                followed += len(left)
            offered = rt.pool.offered_ids()
            if offered:
                gone = await self._tasks.db(offers_gone, sandbox_ids=offered)
                for sandbox_id, state in gone.items():
                    self._follow(rt, sandbox_id, state, reason="offer_lost")
                followed += len(gone)
            idle = rt.pool.idle_offered()
            if idle:
                by_id = {p.sandbox_id: p for p in idle}
                won, others = await self._tasks.db(sandbox_withdraw_offers, sandbox_ids=list(by_id))
                for sandbox_id in won:
                    rt.pool.withdrawn(by_id[sandbox_id])
                for sandbox_id, state in others.items():
                    self._follow(rt, sandbox_id, state, reason="offer_lost")
            self.offer(rt)
        return followed


class Listener:
    """One LISTEN connection in its own thread; each notification's payload goes to
    ``deliver`` on ``loop`` (in commit order, as PostgreSQL sends them)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deliver: Callable[[str], None]) -> None:
        self._loop = loop
        self._deliver = deliver
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sandman-offers", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import psycopg

        params = database_conninfo()
        while not self._stop.is_set():
            try:
                with psycopg.connect(params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.5):
                            self._loop.call_soon_threadsafe(self._deliver, note.payload)
            except psycopg.Error:
                # Claims go on meanwhile; the maintenance round's read follows them.
                log.warning("offer notifications: connection lost", exc_info=True)
                self._stop.wait(LISTEN_RETRY_S)
            except RuntimeError:  # the controller's loop is closed: nothing to tell
                return
