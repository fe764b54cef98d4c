"""The controller with the real local provider and real execd: acquire, warm, caps, drain.

Every sandbox is an execd process; tests check the process and the database rows, not
only return values. Late creates are held by a gate on readiness (``GatedProvider``),
never by sleeping.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from concurrent.futures import ThreadPoolExecutor

import pytest

from sandboxes import events
from sandboxes.controller import PrewarmKey
from sandboxes.models import Acquisition, Job, PendingDelete, Sandbox, SandboxEvent
from sandboxes.tests.conftest import local_provider
from sandboxes.tests.controller_support import (
    IMAGE,
    SPEC,
    GatedProvider,
    OutlivedProvider,
    acquire_args,
    execd,
    kinds,
    make_job,
    pid_of,
    process_alive,
    state,
    wait_until,
)
from sandman_site.errors import (
    AcquireTimeout,
    AlreadyReleased,
    ControllerUnavailable,
    JobNotActive,
    PoolCapReached,
    UnknownImage,
)
from standin.clock import FakeClock


def prewarm_key(count: int = 1, **over) -> PrewarmKey:
    fields = {"image": IMAGE, "base_commit": None, "count": count, **SPEC}
    fields.update(over)
    return PrewarmKey(**fields)


def test_an_acquire_creates_a_sandbox_that_runs_commands_and_release_deletes_it(
    controller, sandbox_root
):
    job = make_job(egress="deny")
    got = controller.acquire(**acquire_args(job))
    assert got.source == "created"
    assert got.wait_ms >= got.queue_ms >= 0
    pid = pid_of(sandbox_root, got.name)
    assert process_alive(pid)
    row = Sandbox.objects.get(pk=got.sandbox_id)
    assert (row.state, row.address, row.source, row.agent_used) == (
        "in_use",
        got.address,
        "created",
        True,
    )
    assert row.api_created_at and row.ready_at and row.acquired_at

    ran = execd(got.address, got.token, "/exec", {"command": "echo $((6*7)) > answer; cat answer"})
    assert ran["exit_code"] == 0 and ran["output"].strip() == "42"

    acq = Acquisition.objects.get(job=job)
    assert (acq.outcome, acq.source, acq.sandbox_id) == ("ok", "created", got.sandbox_id)
    assert acq.create_ms > 0 and acq.wait_ms >= acq.create_ms and acq.queue_ms >= 0

    controller.release(sandbox_id=got.sandbox_id, verdict="pass")
    wait_until(lambda: state(got.sandbox_id) == "deleted", what="the released sandbox deleted")
    assert not process_alive(pid)
    assert not (sandbox_root / got.name).exists()
    assert PendingDelete.objects.count() == 0
    timeline = kinds(got.sandbox_id)
    for earlier, later in [
        (events.CREATE_SENT, events.READY),
        (events.READY, events.ACQUIRED),
        (events.ACQUIRED, events.RELEASED),
        (events.DELETE_SENT, events.DELETED),
    ]:
        assert timeline.index(earlier) < timeline.index(later)
    with pytest.raises(AlreadyReleased):
        controller.release(sandbox_id=got.sandbox_id)


def test_a_prewarmed_pod_is_handed_out_warm_after_a_health_check_and_replaced(
    controller, sandbox_root
):
    job = make_job()
    controller.prewarm(job_id=job.pk, keys=[prewarm_key(1)])
    controller.wait_idle()
    warm = Sandbox.objects.get(job=job)
    assert warm.state == "ready" and not warm.agent_used and warm.source == ""

    got = controller.acquire(**acquire_args(job))
    assert (got.source, got.sandbox_id, got.queue_ms) == ("warm", warm.pk, 0.0)
    handed = Sandbox.objects.get(pk=warm.pk)
    assert handed.state == "in_use" and handed.source == "warm" and handed.healthy_at
    timeline = kinds(warm.pk)
    assert timeline.index(events.HEALTHY) < timeline.index(events.ACQUIRED)
    assert execd(got.address, got.token, "/exec", {"command": "true"})["exit_code"] == 0

    controller.wait_idle()  # the replacement create started by the hand-out settles
    replacement = Sandbox.objects.exclude(pk=warm.pk).get(job=job)
    assert replacement.state == "ready" and not replacement.agent_used
    assert process_alive(pid_of(sandbox_root, replacement.name))
    assert SandboxEvent.objects.filter(sandbox=replacement, kind=events.WARM).exists()


def test_a_request_with_another_spec_is_not_handed_the_warm_pod(controller, sandbox_root):
    job = make_job()
    controller.prewarm(job_id=job.pk, keys=[prewarm_key(1, cpu_millis=250)])
    controller.wait_idle()
    warm = Sandbox.objects.get(job=job)

    got = controller.acquire(**acquire_args(job, cpu_millis=500))
    assert got.source == "created" and got.sandbox_id != warm.pk
    warm.refresh_from_db()
    assert warm.state == "ready" and not warm.agent_used
    assert process_alive(pid_of(sandbox_root, warm.name))
    created = Sandbox.objects.get(pk=got.sandbox_id)
    assert created.cpu_millis == 500 and created.key_hash != warm.key_hash


def test_an_acquire_past_max_live_is_refused_with_pod_cap_and_creates_nothing(controller):
    job = make_job(max_live=1)
    first = controller.acquire(**acquire_args(job))
    with pytest.raises(PoolCapReached) as refused:
        controller.acquire(**acquire_args(job))
    assert refused.value.status == 429 and refused.value.code == "pod_cap"
    assert list(Sandbox.objects.filter(job=job).values_list("pk", flat=True)) == [first.sandbox_id]
    outcomes = list(Acquisition.objects.filter(job=job).order_by("pk").values_list("outcome"))
    assert outcomes == [("ok",), ("cap",)]


def test_acquire_timeout_keeps_the_late_create_and_it_becomes_warm(make_controller, sandbox_root):
    """Table 2, row 1: the caller gives up; the pool owns the create and keeps the pod."""
    provider = local_provider(sandbox_root, cls=GatedProvider)
    controller = make_controller(provider=provider)
    job = make_job()
    try:
        with pytest.raises(AcquireTimeout) as timed_out:
            controller.acquire(**acquire_args(job, timeout_s=0.5))
        assert timed_out.value.status == 504
        assert provider.reached.wait(60), "the create never reached readiness"
        late = Sandbox.objects.get(job=job)
        assert late.state == "creating"
        assert Acquisition.objects.get(job=job).outcome == "timeout"
        pid = pid_of(sandbox_root, late.name)
        assert process_alive(pid)
    finally:
        provider.gate.set()
    controller.wait_idle()
    late.refresh_from_db()
    assert late.state == "ready" and not late.agent_used
    assert SandboxEvent.objects.filter(sandbox=late, kind=events.ACQUIRE_TIMEOUT).exists()
    warm_event = SandboxEvent.objects.get(sandbox=late, kind=events.WARM)
    assert warm_event.detail["late"] is True
    assert process_alive(pid)

    again = controller.acquire(**acquire_args(job))
    assert (again.source, again.sandbox_id) == ("warm", late.pk)
    assert Sandbox.objects.filter(job=job).count() == 1  # no second create


def test_stop_with_a_create_in_flight_leaves_no_unretrieved_task_exception(
    make_controller, sandbox_root, caplog
):
    """The readiness wait outlives its caller at stop and then fails; nothing is left for
    asyncio to report as "Task exception was never retrieved" when it is collected."""
    provider = local_provider(sandbox_root, cls=OutlivedProvider)
    controller = make_controller(provider=provider)
    job = make_job()
    caplog.set_level(logging.DEBUG, logger="asyncio")
    caplog.set_level(logging.DEBUG, logger="sandboxes.controller.tasks")
    with ThreadPoolExecutor(max_workers=1) as caller:
        acquiring = caller.submit(controller.acquire, **acquire_args(job))
        assert provider.reached.wait(60), "the create never reached readiness"
        controller.stop()
        with pytest.raises(ControllerUnavailable):
            acquiring.result(60)
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
    abandoned = [r for r in caplog.records if r.name == "sandboxes.controller.tasks"]
    assert abandoned and "caller left" in str(abandoned[0].exc_info[1])


def test_drain_deletes_warm_in_use_and_creating_sandboxes_then_the_job_is_drained(
    make_controller, sandbox_root
):
    provider = local_provider(sandbox_root, cls=GatedProvider)
    provider.gate.set()
    controller = make_controller(provider=provider)
    job = make_job()
    try:
        in_use = controller.acquire(**acquire_args(job))
        controller.prewarm(job_id=job.pk, keys=[prewarm_key(1)])
        controller.wait_idle()
        warm = Sandbox.objects.get(job=job, state="ready")
        provider.gate.clear()
        provider.reached.clear()
        controller.prewarm(job_id=job.pk, keys=[prewarm_key(2)])
        assert provider.reached.wait(60)
        creating = Sandbox.objects.get(job=job, state="creating")
        pids = {
            s: pid_of(sandbox_root, n)
            for s, n in [
                (in_use.sandbox_id, in_use.name),
                (warm.pk, warm.name),
                (creating.pk, creating.name),
            ]
        }
        assert all(process_alive(p) for p in pids.values())

        controller.drain(job_id=job.pk)
        assert Job.objects.get(pk=job.pk).state == "draining"
        with pytest.raises(JobNotActive):
            controller.acquire(**acquire_args(job))
        wait_until(
            lambda: {state(in_use.sandbox_id), state(warm.pk)} == {"deleted"},
            what="warm and in-use sandboxes deleted by the drain",
        )
        assert state(creating.pk) == "creating"  # held at readiness: deleted once it settles
        assert Job.objects.get(pk=job.pk).state == "draining"
    finally:
        provider.gate.set()
    controller.wait_idle()
    assert state(creating.pk) == "deleted"
    assert not any(process_alive(p) for p in pids.values())
    assert Job.objects.get(pk=job.pk).state == "drained"
    assert PendingDelete.objects.count() == 0
    assert SandboxEvent.objects.filter(kind=events.DRAINED).count() == 3


def test_a_cancelled_acquire_leaves_its_create_to_the_pool_which_keeps_the_pod(
    make_controller, sandbox_root
):
    """Table 2, row 1 (cancellation): cancelling the caller does not cancel its create."""
    provider = local_provider(sandbox_root, cls=GatedProvider)
    controller = make_controller(provider=provider)
    job = make_job()

    async def cancel_while_creating() -> None:
        caller = asyncio.create_task(controller.aacquire(**acquire_args(job)))
        reached = await asyncio.to_thread(provider.reached.wait, 60)
        assert reached, "the create never reached readiness"
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller

    try:
        asyncio.run(cancel_while_creating())
        pending = Sandbox.objects.get(job=job)
        assert pending.state == "creating"
    finally:
        provider.gate.set()
    controller.wait_idle()
    pending.refresh_from_db()
    assert pending.state == "ready" and not pending.agent_used
    assert process_alive(pid_of(sandbox_root, pending.name))
    assert Acquisition.objects.get(job=job).outcome == "cancelled"


def test_an_acquire_behind_the_job_bucket_waits_in_the_pacer_and_reports_that_wait(
    make_controller,
):
    clock = FakeClock()
    controller = make_controller(
        clock=clock.monotonic, now=clock.now, sleep=clock.sleep, maintenance_interval_s=None
    )
    job = make_job(rate_per_s=0.2, burst=1)  # one create now, the next 5 s later
    first = controller.acquire(**acquire_args(job))
    assert first.queue_ms < 5000
    with ThreadPoolExecutor(max_workers=1) as caller:
        second = caller.submit(controller.acquire, **acquire_args(job))
        wait_until(lambda: controller.pacer_queue_length() == 1, what="a create queued")
        assert Sandbox.objects.filter(job=job).count() == 2  # its row precedes the create
        assert not second.done()
        controller.loop.call_soon_threadsafe(clock.advance, 5.0)  # the loop owns the clock
        got = second.result(timeout=60)
    assert got.source == "created" and got.queue_ms >= 5000 and got.wait_ms >= got.queue_ms
    assert controller.pacer_queue_length() == 0
    acq = Acquisition.objects.get(sandbox_id=got.sandbox_id)
    assert acq.queue_ms >= 5000 and acq.outcome == "ok"


def test_a_warm_pod_that_fails_its_health_check_is_deleted_and_never_handed_out(
    controller, sandbox_root
):
    job = make_job()
    controller.prewarm(job_id=job.pk, keys=[prewarm_key(1)])
    controller.wait_idle()
    broken = Sandbox.objects.get(job=job)
    pid = pid_of(sandbox_root, broken.name)
    os.kill(pid, signal.SIGKILL)  # the sandbox dies while warm
    wait_until(lambda: not process_alive(pid), what="the warm sandbox to die")

    got = controller.acquire(**acquire_args(job))
    assert got.source == "created" and got.sandbox_id != broken.pk
    controller.wait_idle()
    broken.refresh_from_db()
    assert broken.state == "deleted" and not broken.agent_used
    assert SandboxEvent.objects.filter(sandbox=broken, kind=events.HEALTH_FAILED).exists()
    assert not SandboxEvent.objects.filter(sandbox=broken, kind=events.ACQUIRED).exists()


def test_an_unknown_image_is_refused_and_its_row_ends_deleted_with_the_reason(
    controller, sandbox_root
):
    job = make_job()
    with pytest.raises(UnknownImage) as refused:
        controller.acquire(**acquire_args(job, image="no/such-image"))
    assert refused.value.status == 400
    controller.wait_idle()
    row = Sandbox.objects.get(job=job)
    assert row.state == "deleted" and "no/such-image" in row.failure_reason
    assert Acquisition.objects.get(job=job).outcome == "failed"
    assert list(sandbox_root.iterdir()) == []  # nothing was created on the backend
    assert PendingDelete.objects.count() == 0


def test_max_creating_holds_extra_creates_until_a_creating_slot_frees(
    make_controller, sandbox_root
):
    provider = local_provider(sandbox_root, cls=GatedProvider)
    controller = make_controller(provider=provider)
    job = make_job(max_creating=1)
    try:
        controller.prewarm(job_id=job.pk, keys=[prewarm_key(2)])
        assert provider.reached.wait(60)
        wait_until(lambda: Sandbox.objects.filter(job=job).count() == 2, what="both rows")
        states = sorted(Sandbox.objects.filter(job=job).values_list("state", flat=True))
        assert states == ["creating", "requested"]  # the second waits for the slot
        assert provider.held == 1
    finally:
        provider.gate.set()
    controller.wait_idle()
    assert provider.held == 2
    rows = Sandbox.objects.filter(job=job)
    assert sorted(rows.values_list("state", flat=True)) == ["ready", "ready"]
    assert all(process_alive(pid_of(sandbox_root, r.name)) for r in rows)


def test_a_burst_of_first_acquires_of_a_job_reads_its_row_once(controller, monkeypatch):
    """Acquires of a job this controller holds no books for read its row (job_info) to
    check it takes acquires. Started in one go on the controller's loop (as a burst's calls
    land), all of them reach that read before the first answer can: they share it, and
    each still refuses by what it says (here: draining)."""
    from sandboxes.controller import queries

    job = make_job()
    Job.objects.filter(pk=job.pk).update(state="draining")
    reads: list[int] = []
    real = queries.job_info

    def counted(job_id: int):
        reads.append(job_id)
        return real(job_id)

    monkeypatch.setattr(queries, "job_info", counted)

    async def burst() -> list[object]:
        calls = [controller.aacquire(**acquire_args(job)) for _ in range(6)]
        return await asyncio.gather(*calls, return_exceptions=True)

    answers = asyncio.run_coroutine_threadsafe(burst(), controller.loop).result(60)
    assert [type(a) for a in answers] == [JobNotActive] * 6, answers
    assert reads == [job.pk]
    # A later first use reads again (the shared read ended with its callers).
    with pytest.raises(JobNotActive):
        controller.acquire(**acquire_args(job))
    assert reads == [job.pk, job.pk]
    assert not Sandbox.objects.filter(job=job).exists()
