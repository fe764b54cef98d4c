"""Table A21 windows 1-15: cancellations, acquire timeouts and a drain, as trial steps.

What "cancel", "times out" and "drain" mean here, and why our outcomes (a late pod kept
warm) differ from the paper's where they do: ``windows.py``. Each function arms its
gates and plans, starts the caller, waits until a gate is REACHED, pulls the trigger,
audits, releases and checks the outcome; the caller of the function then settles.
"""

from __future__ import annotations

from collections.abc import Callable

from sandboxes import events
from sandboxes.models import PendingDelete, Sandbox, SandboxEvent
from sandboxes.states import JobState, SandboxState
from sandman_site.errors import AcquireTimeout
from standin.harness.rig import BUDGET_S, TIMEOUT_S, Trial
from standin.harness.support import on_loop, pending_names, wait_until


# --- outcome checks ----------------------------------------------------------------------------
def kept_warm(t: Trial, role: str = "rollout") -> None:
    row = t.row()
    assert (row.state, row.agent_used, row.role) == (SandboxState.READY, False, role)
    warm = SandboxEvent.objects.get(sandbox=row, kind=events.WARM)
    assert warm.detail["late"] is True
    pod = t.pod()
    assert pod is not None and pod["status"]["phase"] == "Running"


def deleted_now(t: Trial) -> None:
    """The window's pod is gone from the store and its row ended."""
    assert t.pod() is None
    assert t.row().state == SandboxState.DELETED


def pending_after_failed_delete(t: Trial) -> None:
    """The cleanup delete failed: the pod is still in the store, owned by the books."""
    assert t.pod() is not None
    assert t.row().state == SandboxState.DELETING
    pending = PendingDelete.objects.get(name=t.subject)
    assert pending.attempts >= 1 and pending.last_error
    assert t.subject in pending_names(t.controller)


# --- cancel before the API stores the pod ---------------------------------------------------
def w01(t: Trial) -> None:
    gate = t.gate("work_item", verb="create")
    call = t.acquire()
    t.reached(gate)
    t.cancel(call)
    t.audit("held")
    assert t.pod() is None and t.row().state == SandboxState.CREATING
    gate.release()
    t.idle()
    kept_warm(t)


def w02(t: Trial) -> None:
    gate = t.gate("create_received")
    call = t.acquire()
    t.reached(gate)
    t.cancel(call)
    t.audit("held")
    gate.release()
    t.idle()
    kept_warm(t)


def w03(t: Trial) -> None:
    gate = t.gate("create_received")
    t.plan("create", "403")
    call = t.acquire()
    t.reached(gate)
    t.cancel(call)
    t.audit("held")
    gate.release()
    t.idle()
    row = t.row()
    assert row.state == SandboxState.DELETED and "403" in row.failure_reason
    assert t.subject not in t.rig.store_clock.created  # never stored


def w04(t: Trial) -> None:
    warm_build = t.gate("ready")
    t.prewarm(1)
    t.reached(warm_build)  # the warm build holds the job's only create slot
    t.subject = ""
    call = t.acquire(timeout_s=TIMEOUT_S)
    rt = on_loop(t.controller, lambda: t.controller.job_runtime(t.job.pk))
    assert rt is not None, "the warm build loaded the job's runtime"
    wait_until(
        lambda: on_loop(t.controller, lambda: rt.slots.waiting) == 1,
        what="the acquire's create waiting for a create slot",
    )
    t.expire()
    assert isinstance(t.outcome(call), AcquireTimeout)
    late = t.row(name=newest_name(t))
    t.subject = late.name
    assert late.state == SandboxState.REQUESTED  # not sent yet
    t.audit("held")
    warm_build.release()
    t.idle()
    kept_warm(t)  # sent once the slot freed; nobody used it


def newest_name(t: Trial) -> str:
    return Sandbox.objects.filter(job=t.job).order_by("-pk").values_list("name", flat=True)[0]


# --- cancel after the API stores the pod, before the caller has it -------------------------
def cancel_held(point: str, verb: str | None = None) -> Callable[[Trial], None]:
    def run(t: Trial) -> None:
        gate = t.gate(point, verb=verb)
        call = t.acquire()
        t.reached(gate)
        t.cancel(call)
        t.audit("held")
        gate.release()
        t.idle()
        kept_warm(t)

    return run


# --- a second (and third) cancel during cleanup -----------------------------------------------
def w08(t: Trial) -> None:
    gate = t.gate("create_stored")
    call = t.acquire()
    t.reached(gate)
    t.cancel(call)  # first cancel: the caller
    assert t.cancel_create(times=2)  # the create's own task, twice, while the call is held
    t.audit("held")
    gate.release()
    t.idle()
    deleted_now(t)
    assert delete_reason(t) == "create_cancelled"


def w09(t: Trial) -> None:
    stored = t.gate("create_stored")
    deleting = t.gate("delete_received")
    call = t.acquire()
    t.reached(stored)
    t.cancel(call)
    assert t.cancel_create()
    stored.release()
    deleting.wait_reached(60)
    assert t.cancel_destroy(t.subject, times=2)  # second and third cancel: the cleanup's task
    t.audit("delete held")
    deleting.release()
    t.idle()
    assert t.pod() is None  # the held delete was applied ...
    assert PendingDelete.objects.filter(name=t.subject).exists()  # ... but not yet confirmed
    t.audit("unconfirmed")


def delete_reason(t: Trial) -> str:
    sent = SandboxEvent.objects.filter(sandbox=t.row(), kind=events.DELETE_SENT).first()
    return (sent.detail or {}).get("reason", "") if sent else ""


# --- acquire timeouts with the create in flight ---------------------------------------------
def timeout_held(point: str, role: str) -> Callable[[Trial], None]:
    def run(t: Trial) -> None:
        gate = t.gate(point)
        call = t.acquire(role=role, timeout_s=TIMEOUT_S)
        t.reached(gate)
        t.expire()
        assert isinstance(t.outcome(call), AcquireTimeout)
        t.audit("held")
        gate.release()
        t.idle()
        kept_warm(t, role)

    return run


def w13(t: Trial) -> None:
    timeout_held("ready", "grading")(t)
    parked = t.row()
    again = t.outcome(t.acquire(role="grading"))
    assert (again.source, again.sandbox_id) == ("warm", parked.pk)


def w14(t: Trial) -> None:
    t.plan("pod", "never_ready")
    probe = t.gate("probe")
    call = t.acquire(timeout_s=TIMEOUT_S)
    t.reached(probe)  # Running, waiting for a Ready that never comes
    t.expire()
    assert isinstance(t.outcome(call), AcquireTimeout)
    t.audit("waiting for Ready")
    probe.release()
    wait_until(lambda: t.rig.clock.sleepers >= 1, what="the readiness budget running")
    t.expire(BUDGET_S)
    t.idle()
    deleted_now(t)
    assert "not Ready" in t.row().failure_reason


# --- a drain while a warm pod starts -------------------------------------------------------------
def w15(t: Trial) -> None:
    gate = t.gate("ready")
    t.prewarm(1)
    t.reached(gate)
    t.drain()
    t.audit("held")
    assert t.job.__class__.objects.get(pk=t.job.pk).state == JobState.DRAINING
    gate.release()
    t.idle()
    deleted_now(t)
    assert SandboxEvent.objects.filter(sandbox=t.row(), kind=events.DRAINED).exists()
