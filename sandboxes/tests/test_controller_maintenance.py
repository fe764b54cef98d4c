"""Periodic work with the real local provider: idle trim and lifetime reclaim on a fake
clock (the test advances it; nothing sleeps), and the sweep of ownerless sandboxes."""

from __future__ import annotations

import pytest

from sandboxes import events
from sandboxes.controller import ControllerHooks, PrewarmKey
from sandboxes.models import PendingDelete, Sandbox, SandboxEvent
from sandboxes.tests.controller_support import (
    IMAGE,
    SPEC,
    acquire_args,
    create_unknown_sandbox,
    make_job,
    pid_of,
    process_alive,
    state,
)
from sandman_site.errors import AlreadyReleased
from standin.clock import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def clocked(make_controller, clock):
    # No background maintenance: each round runs when the test asks, at the fake time.
    return make_controller(
        clock=clock.monotonic, now=clock.now, sleep=clock.sleep, maintenance_interval_s=None
    )


def test_warm_pods_of_a_key_idle_past_the_timeout_are_trimmed(clocked, clock, sandbox_root):
    job = make_job(idle_timeout_s=300)
    key = {"image": IMAGE, "base_commit": None, **SPEC}
    clocked.prewarm(job_id=job.pk, keys=[PrewarmKey(count=1, **key)])
    clocked.wait_idle()
    warm = Sandbox.objects.get(job=job)
    pid = pid_of(sandbox_root, warm.name)
    assert warm.state == "ready" and process_alive(pid)

    clock.advance(299)
    assert clocked.run_maintenance()["trimmed"] == 0
    assert state(warm.pk) == "ready"
    clock.advance(1)
    counts = clocked.run_maintenance()
    assert counts["trimmed"] == 1 and counts["warm_started"] == 0  # the target went too
    assert state(warm.pk) == "deleted"
    assert not process_alive(pid)
    assert SandboxEvent.objects.filter(sandbox=warm, kind=events.TRIMMED).exists()


def test_a_sandbox_held_past_its_jobs_lifetime_is_reclaimed(clocked, clock, sandbox_root):
    job = make_job(max_lifetime_s=60)
    got = clocked.acquire(**acquire_args(job))
    pid = pid_of(sandbox_root, got.name)

    clock.advance(59)
    assert clocked.run_maintenance()["reclaimed"] == 0
    assert state(got.sandbox_id) == "in_use" and process_alive(pid)
    clock.advance(2)
    assert clocked.run_maintenance()["reclaimed"] == 1
    assert state(got.sandbox_id) == "deleted"
    assert not process_alive(pid)
    reclaimed = SandboxEvent.objects.get(sandbox_id=got.sandbox_id, kind=events.RECLAIMED)
    assert reclaimed.detail["reason"] == "max_lifetime"
    with pytest.raises(AlreadyReleased):
        clocked.release(sandbox_id=got.sandbox_id)


def test_the_sweep_deletes_an_ownerless_sandbox_reports_counts_and_spares_owned_ones(
    make_controller, sandbox_root
):
    controller = make_controller(wired=True)  # the service's wiring: the incidents hooks
    job = make_job()
    owned = controller.acquire(**acquire_args(job))
    owned_pid = pid_of(sandbox_root, owned.name)
    stray, stray_pid = create_unknown_sandbox(sandbox_root)
    assert process_alive(stray_pid)

    report = controller.sweep()
    assert {k: report[k] for k in ("listed", "owned", "ownerless", "deleted", "failed")} == {
        "listed": 2,
        "owned": 1,
        "ownerless": 1,
        "deleted": 1,
        "failed": 0,
    }
    assert report["names"] == [stray]
    assert report["hook_failures"] == 0
    assert not process_alive(stray_pid) and not (sandbox_root / stray).exists()
    assert process_alive(owned_pid) and state(owned.sandbox_id) == "in_use"
    assert PendingDelete.objects.count() == 0

    again = controller.sweep()  # idempotent
    assert (again["listed"], again["ownerless"], again["deleted"]) == (1, 0, 0)

    # The sweep's finding reached the incidents app as one draft, opened once.
    from incidents.models import Incident, OwnerlessPod

    drafts = Incident.objects.filter(title__startswith="Ownerless pods found by the sweep")
    assert drafts.count() == 1
    assert drafts.get().status == "open"
    assert list(OwnerlessPod.objects.values_list("name", flat=True)) == [stray]


def test_a_sweep_hook_that_raises_is_logged_with_its_traceback_and_counted(
    make_controller, sandbox_root, caplog
):
    seen: list[list[str]] = []

    def boom(now) -> None:
        raise RuntimeError("detectors are broken")

    hooks = ControllerHooks(ownerless_found=lambda names, now: seen.append(names), after_sweep=boom)
    controller = make_controller(hooks=hooks)
    stray, _ = create_unknown_sandbox(sandbox_root)

    with caplog.at_level("ERROR", logger="sandboxes.controller.hooks"):
        report = controller.sweep()
    assert report["deleted"] == 1 and report["hook_failures"] == 1
    assert seen == [[stray]]  # the other hook still ran, with what the sweep found
    failed = [r for r in caplog.records if "after_sweep" in r.getMessage()]
    assert failed and failed[0].exc_info and "detectors are broken" in str(failed[0].exc_info[1])
    assert controller.sweep()["hook_failures"] == 1  # every sweep calls it again, and counts
