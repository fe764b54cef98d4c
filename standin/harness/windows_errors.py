"""Table A21 windows 16-25: creates stored but answered with an error, deletes that fail
or lose their reply, and a name held by another tenant's pod (409)."""

from __future__ import annotations

from collections.abc import Callable

from sandboxes.models import PendingDelete
from sandboxes.states import JobState, SandboxState
from sandman_site.errors import (
    AcquireTimeout,
    ProviderAmbiguous,
    ProviderConflict,
    SandboxNotReady,
)
from standin.harness.rig import TIMEOUT_S, Trial
from standin.harness.support import NS, other_tenant_pod
from standin.harness.windows_cancel import (
    deleted_now,
    newest_name,
    pending_after_failed_delete,
)


# --- a create stored, but answered with an error ---------------------------------------------
def stored_then(action: str) -> Callable[[Trial], None]:
    def run(t: Trial) -> None:
        t.plan("create", action)
        t.mark_trigger()
        error = t.outcome(t.acquire())
        assert isinstance(error, ProviderAmbiguous), error
        t.subject = error.extra["name"]
        assert (error.extra["stored"], error.extra["reclaimed"]) == (True, True)
        assert t.pod() is None  # read back by name, deleted on the nonce match
        t.audit("answered")
        t.idle()
        assert t.row().state == SandboxState.DELETED

    return run


def w18(t: Trial) -> None:
    gate = t.gate("create_stored")
    t.plan("create", "504_after_store")
    call = t.acquire(role="grading", timeout_s=TIMEOUT_S)
    t.reached(gate)
    t.expire()
    assert isinstance(t.outcome(call), AcquireTimeout)
    t.audit("held")
    gate.release()
    t.idle()
    deleted_now(t)


# --- a delete that fails or loses its reply ------------------------------------------------------
def cleanup_delete_fails(action: str) -> Callable[[Trial], None]:
    def run(t: Trial) -> None:
        gate = t.gate("ready")
        t.plan("delete", action)
        call = t.acquire()
        t.reached(gate)
        t.cancel(call)
        assert t.cancel_create()
        t.audit("held")
        gate.release()
        t.idle()
        if action == "reset_after_apply":  # applied, reply lost: gone, not yet confirmed
            assert t.pod() is None and PendingDelete.objects.filter(name=t.subject).exists()
        else:
            pending_after_failed_delete(t)
        t.audit("delete unconfirmed")

    return run


def w22(t: Trial) -> None:
    t.plan("pod", "fail_start")
    t.plan("delete", "500_not_applied")
    t.mark_trigger()
    error = t.outcome(t.acquire())
    assert isinstance(error, SandboxNotReady), error
    t.subject = t.row(name=newest_name(t)).name
    t.idle()
    pod = t.pod()
    assert pod is not None and pod["status"]["phase"] == "Failed"
    pending_after_failed_delete(t)
    t.audit("delete failed")


def w23(t: Trial) -> None:
    got = t.outcome(t.acquire())
    t.subject = got.name
    t.plan("delete", "500_not_applied")
    t.drain()  # the job's end destroys the handed-out sandbox
    t.idle()
    pending_after_failed_delete(t)
    assert t.job.__class__.objects.get(pk=t.job.pk).state == JobState.DRAINING
    t.audit("delete failed")


def w24(t: Trial) -> None:
    got = t.outcome(t.acquire())
    t.subject = got.name
    t.plan("delete", "500_not_applied")
    t.mark_trigger()
    t.controller.release(sandbox_id=got.sandbox_id)
    t.idle()
    pending_after_failed_delete(t)
    t.audit("delete failed")


# --- a 409: another tenant's pod holds the name ------------------------------------------------
def w25(t: Trial) -> None:
    gate = t.gate("work_item", verb="create")
    call = t.acquire()
    name = t.reached(gate)
    holder = t.cluster.put_pod(NS, other_tenant_pod(name))
    t.rig.sentinels[name] = holder["metadata"]["uid"]
    t.mark_trigger()
    gate.release()
    error = t.outcome(call)
    assert isinstance(error, ProviderConflict) and error.status == 409, error
    assert error.extra["holder_uid"] == holder["metadata"]["uid"]
    t.audit("answered")
    t.idle()
    assert t.row().state == SandboxState.DELETED
    deletes = [r for r in t.cluster.requests_log() if r["verb"] == "delete"]
    assert [r for r in deletes if r["name"] == name] == []
    pod = t.pod()
    assert pod is not None and pod["metadata"]["uid"] == holder["metadata"]["uid"]
