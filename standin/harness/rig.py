"""A rig (stand-in + controller + trainer loop) and a trial (one job driven through a window).

Used by the window tests, the randomized variant and ``bench/cancellation_windows.py``;
nothing here depends on pytest. A :class:`Trial` makes its own job, so one rig serves
many trials: gates and plans match the job's pod-name prefix ``sm-<job>-``.

Trial life: arm gates and plans -> start acquires (or a prewarm) -> wait for a gate ->
pull the trigger (cancel the caller, cancel the controller's create task, expire the
acquire timeout on the fake clock, drain) -> audit -> release -> audit -> ``settle()``:
drain the job, settle every pending delete, and check that the store holds no pod of
the job, the anchor is gone and every other tenant's pod kept its uid.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any

from sandboxes.controller import Controller, PrewarmKey
from sandboxes.models import Acquisition, Job, PendingDelete, Sandbox
from sandboxes.states import AcquisitionOutcome, JobState, SandboxState
from standin import Gate, StandinCluster
from standin.clock import FakeClock
from standin.harness.jobs import IMAGE, SPEC, make_job
from standin.harness.support import (
    NS,
    SENTINEL,
    AuditReport,
    Caller,
    StoreClock,
    advance,
    audit,
    cancel_tasks,
    k8s_provider,
    on_loop,
    other_pods,
    other_tenant_pod,
    pending_names,
    sandman_pods,
    wait_until,
)

TIMEOUT_S = 1.0  # an acquire's timeout when a window expires it (fake clock)
LONG_S = 3600.0  # an acquire's timeout when it must not expire
BUDGET_S = 120.0  # readiness budget (fake clock)


class Rig:
    def __init__(self, *, nodes: int = 2, run_execd: bool = True, seed: int = 0, **config: Any):
        self.nodes, self.run_execd, self.seed, self.config = nodes, run_execd, seed, config
        self.cluster = StandinCluster(nodes=nodes, run_execd=run_execd, seed=seed)
        self.clock = FakeClock()
        self.store_clock = StoreClock()
        self.controllers: list[Controller] = []
        self.caller: Caller | None = None
        self.sentinels: dict[str, str] = {}

    def start(self) -> Rig:
        self.cluster.start()
        self.cluster.add_store_listener(self.store_clock)
        sentinel = self.cluster.put_pod(NS, other_tenant_pod(SENTINEL))
        self.sentinels[SENTINEL] = sentinel["metadata"]["uid"]
        self.caller = Caller()
        self.new_controller()
        return self

    @property
    def controller(self) -> Controller:
        return self.controllers[-1]

    def new_controller(self, **config: Any) -> Controller:
        provider = k8s_provider(
            self.cluster,
            clock=self.clock,
            work_item_hook=self.cluster.gates.work_item_hook,
            **{**self.config, **config},
        )
        controller = Controller(
            provider=provider,
            sweep_interval_s=0,
            maintenance_interval_s=None,
            clock=self.clock.monotonic,
            sleep=self.clock.sleep,
            cluster_rate=1000.0,
            cluster_burst=100_000,
        )
        self.controllers.append(controller)
        controller.start()
        return controller

    def stop(self) -> None:
        try:
            if self.caller is not None:
                self.caller.close()
        finally:
            try:
                for controller in self.controllers:
                    controller.stop()
            finally:
                self.quiesce()
                self.cluster.stop()

    def quiesce(self) -> None:
        """Let the stand-in finish what it started (an execd still booting for a pod that
        is already gone stops itself once it listens); a stop in the middle of that boot
        would leave the execd process running unowned."""
        if not self.cluster.started:
            return
        self.cluster.gates.release_all()
        self.cluster.run_until_idle(timeout=60)

    def __enter__(self) -> Rig:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Trial:
    """One job on a rig. ``audits`` keeps every audit; any ownerless pod fails at once."""

    def __init__(self, rig: Rig, **job: Any) -> None:
        self.rig = rig
        self.job = make_job(egress="deny", readiness_budget_s=BUDGET_S, **job)
        self.prefix = f"sm-{self.job.pk}-"
        self.calls: list[concurrent.futures.Future[Any]] = []
        self.errors: list[BaseException] = []
        self.audits: list[AuditReport] = []
        self.t_trigger: float | None = None
        self.subject = ""  # the pod the window is about (from the first gate reached)
        self.drain_started: float | None = None
        self.gates: list[Gate] = []
        self.plans: list[Any] = []
        self.released_at: float | None = None  # first release of a gate (hold length)

    @property
    def controller(self) -> Controller:
        return self.rig.controller

    @property
    def cluster(self) -> StandinCluster:
        return self.rig.cluster

    # -- arming ---------------------------------------------------------------------------
    def gate(self, point: str, *, verb: str | None = None, kind: str = "pods") -> Gate:
        def match(ctx: Any) -> bool:
            return (verb is None or ctx.verb == verb) and (ctx.kind or "pods") == kind

        gate = self.cluster.gates.add(point, match, name_prefix=self.prefix)
        release = gate.release

        def stamped_release() -> None:  # when the hold ended (benchmark timing)
            self.released_at = self.released_at or time.monotonic()
            release()

        gate.release = stamped_release  # type: ignore[method-assign]
        self.gates.append(gate)
        return gate

    def plan(self, verb: str, action: str, times: int | None = 1) -> Any:
        plan = self.cluster.plans.add(verb, action, name_prefix=self.prefix, times=times)
        self.plans.append(plan)
        return plan

    @property
    def hit(self) -> bool:
        """Every gate this trial armed was reached and every failure plan fired."""
        return all(g.is_reached for g in self.gates) and all(p.fired for p in self.plans)

    def reached(self, gate: Gate, timeout: float = 60.0) -> str:
        name = gate.wait_reached(timeout).name
        self.subject = self.subject or name
        return name

    # -- callers ----------------------------------------------------------------------------
    def acquire(
        self, *, role: str = "rollout", timeout_s: float = LONG_S, **over: Any
    ) -> concurrent.futures.Future[Any]:
        args = {
            "job_id": self.job.pk,
            "image": IMAGE,
            "base_commit": None,
            "role": role,
            "timeout_s": timeout_s,
            **SPEC,
            **over,
        }
        assert self.rig.caller is not None
        call = self.rig.caller.submit(self.controller.aacquire(**args))
        self.calls.append(call)
        return call

    def prewarm(self, count: int = 1, role: str = "rollout") -> None:
        key = PrewarmKey(image=IMAGE, base_commit=None, count=count, role=role, **SPEC)
        self.controller.prewarm(job_id=self.job.pk, keys=[key])

    def outcome(self, call: concurrent.futures.Future[Any], timeout: float = 60.0) -> Any:
        """The call's result, or the exception it ended with (kept in ``errors``)."""
        try:
            return call.result(timeout)
        except concurrent.futures.CancelledError as exc:
            return exc
        except Exception as exc:  # the caller's error is part of what a window shows
            self.errors.append(exc)
            return exc

    # -- triggers -----------------------------------------------------------------------------
    def mark_trigger(self) -> None:
        self.t_trigger = self.t_trigger or time.monotonic()

    def cancel(self, call: concurrent.futures.Future[Any]) -> bool:
        """Cancel the caller; return once the controller recorded the cancellation.

        False if the call had already finished (nothing left to cancel).
        """
        before = self._cancelled()
        self.mark_trigger()
        if not call.cancel():
            assert call.done()
            return False
        wait_until(lambda: self._cancelled() > before, what="the cancelled acquire recorded")
        return True

    def _cancelled(self) -> int:
        return Acquisition.objects.filter(
            job=self.job, outcome=AcquisitionOutcome.CANCELLED
        ).count()

    def cancel_create(self, times: int = 1) -> list[str]:
        """Cancel the controller's own tasks running this job's creates (``times`` times):
        an acquire's create and warm builds alike."""
        self.mark_trigger()
        hit: list[str] = []
        for _ in range(times):
            hit += cancel_tasks(self.controller, f"create-{self.job.pk}-")
            hit += cancel_tasks(self.controller, f"warm-{self.job.pk}", exact=True)
        return hit

    def cancel_destroy(self, name: str, times: int = 1) -> list[str]:
        hit: list[str] = []
        for _ in range(times):
            hit += cancel_tasks(self.controller, f"destroy-{name}", exact=True)
        return hit

    def expire(self, seconds: float = TIMEOUT_S) -> None:
        """Advance the fake clock: acquire deadlines and readiness budgets due now expire."""
        self.mark_trigger()
        advance(self.controller, self.rig.clock, seconds)

    def drain(self) -> None:
        """The drain as a trigger (``settle`` drains again; only that one ends timings)."""
        self.mark_trigger()
        self.controller.drain(job_id=self.job.pk)

    # -- observation --------------------------------------------------------------------------
    def audit(self, at: str) -> AuditReport:
        held = [r.name for c in self.calls if c.done() and not c.cancelled() if (r := _result(c))]
        report = audit(self.cluster, self.controller, held=held, errors=self.errors, at=at)
        self.audits.append(report)
        assert report.ownerless == [], f"pods without an owner at {at}: {report}"
        return report

    def row(self, name: str | None = None) -> Sandbox:
        return Sandbox.objects.get(name=name or self.subject)

    def pod(self, name: str | None = None) -> dict[str, Any] | None:
        return self.cluster.pod(NS, name or self.subject)

    def idle(self, timeout: float = 60.0) -> None:
        self.controller.wait_idle(timeout)

    # -- settlement -----------------------------------------------------------------------------
    def settle(self, *, expire_budgets: bool = False) -> None:
        """Release every hold, drain the job, settle deletes; check nothing is left."""
        self.released_at = self.released_at or time.monotonic()
        self.cluster.gates.release_all()
        if expire_budgets:  # pods that never become Ready fail once their budget runs out
            wait_until(self._expired_and_quiet, what=f"job {self.job.pk}'s creates settled")
        for call in self.calls:
            self.outcome(call)
        self.idle()
        self.audit("released")
        self.controller.settle_deletes()  # the retry of whatever delete is still pending
        self.idle()
        self.audit("retried")
        self.drain_started = time.monotonic()
        self.controller.drain(job_id=self.job.pk)

        def drained() -> bool:
            self.idle()
            self.audit("draining")
            self.controller.settle_deletes()
            self.controller.run_maintenance()
            return Job.objects.get(pk=self.job.pk).state == JobState.DRAINED

        wait_until(drained, what=f"job {self.job.pk} drained")
        self.check_clean()

    def _expired_and_quiet(self) -> bool:
        """Advance the fake clock past the readiness budget whenever something sleeps on it;
        True once no call and no controller task is left."""
        controller, clock = self.controller, self.rig.clock
        if on_loop(controller, lambda: clock.sleepers):
            self.expire(BUDGET_S + 1)
        return all(c.done() for c in self.calls) and on_loop(
            controller, lambda: not controller.owned_tasks()
        )

    def check_clean(self) -> None:
        assert sandman_pods(self.cluster, self.prefix) == []
        others = other_pods(self.cluster)
        for name, uid in self.rig.sentinels.items():
            assert others.get(name) == uid, f"another tenant's pod {name} was touched"
        anchors = {c["metadata"]["name"] for c in self.cluster.configmaps(NS)}
        assert f"sandman-job-{self.job.pk}" not in anchors
        rows = Sandbox.objects.filter(job=self.job)
        assert set(rows.values_list("state", flat=True)) <= {SandboxState.DELETED}
        assert not PendingDelete.objects.filter(name__startswith=self.prefix).exists()
        pending = pending_names(self.controller)
        assert [n for n in pending if n.startswith(self.prefix)] == []

    # -- timing (benchmark) ----------------------------------------------------------------------
    def timing(self) -> dict[str, float | None]:
        """ms from the trigger to the first caller's answer and to the subject's delete
        (None if it was deleted only by the job's drain, or never sent)."""
        if self.t_trigger is None:
            return {"caller_ms": None, "delete_ms": None, "hold_ms": None}
        stamps = [getattr(c, "finished_at", None) for c in self.calls]
        finished: list[float] = [f for f in stamps if f is not None and f >= self.t_trigger]
        deleted = self.rig.store_clock.deleted.get(self.subject) if self.subject else None
        drain = self.drain_started
        if deleted is not None and drain is not None and drain > self.t_trigger:
            deleted = deleted if deleted < drain else None  # the drain removed it, not the window
        released = self.released_at
        return {
            "caller_ms": (min(finished) - self.t_trigger) * 1000.0 if finished else None,
            "delete_ms": (deleted - self.t_trigger) * 1000.0 if deleted else None,
            "hold_ms": (released - self.t_trigger) * 1000.0
            if released and released >= self.t_trigger
            else None,
        }


def _result(call: concurrent.futures.Future[Any]) -> Any:
    if call.exception() is not None:
        return None
    return call.result()
