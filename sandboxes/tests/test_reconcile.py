"""Restarts: a new controller over the same database and sandbox root reconciles.

A local sandbox ends with the thread that spawned it (--die-with-parent): with the
stopped controller's loop thread. To have sandboxes outlive a controller, as pods outlive
a restarted service, the adoption tests spawn them from a thread the test owns
(``SurvivingProvider``); the last test restarts with the plain provider, whose sandboxes
die with the old controller and must be cleaned up, not adopted.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sandboxes import events
from sandboxes.controller import PrewarmKey
from sandboxes.models import PendingDelete, Sandbox, SandboxEvent
from sandboxes.services import sandbox_mark_creating, sandbox_request
from sandboxes.services.acquisitions import acquisition_finish, acquisition_start
from sandboxes.services.recovery import acquisition_recover, sandboxes_unanswered
from sandboxes.tests.batch_support import hand_out_created
from sandboxes.tests.conftest import local_provider
from sandboxes.tests.controller_support import (
    IMAGE,
    SPEC,
    FailingDestroyProvider,
    SurvivingProvider,
    acquire_args,
    create_unknown_sandbox,
    execd,
    make_job,
    pid_of,
    process_alive,
    state,
    wait_until,
)


def surviving(root, spawner) -> SurvivingProvider:
    return local_provider(root, isolation="off", cls=SurvivingProvider, spawner=spawner)


def one_in_use_one_warm(make_controller, provider, job) -> tuple[Any, Sandbox]:
    """A controller on ``provider`` acquires one sandbox and prewarms one, then stops:
    the acquire's answer and the warm row (both left running by a surviving provider)."""
    first = make_controller(provider=provider)
    in_use = first.acquire(**acquire_args(job))
    first.prewarm(job_id=job.pk, keys=[PrewarmKey(image=IMAGE, base_commit=None, count=1, **SPEC)])
    first.wait_idle()
    warm = Sandbox.objects.get(job=job, state="ready")
    first.stop()
    return in_use, warm


def test_a_restarted_controller_adopts_known_sandboxes_and_deletes_the_rest(
    make_controller, sandbox_root, spawner
):
    job = make_job()
    in_use, warm = one_in_use_one_warm(make_controller, surviving(sandbox_root, spawner), job)

    stray, stray_pid = create_unknown_sandbox(sandbox_root)
    orphan = sandbox_request(
        job_id=job.pk,
        role="rollout",
        image=IMAGE,
        base_commit=None,
        key_hash="0" * 16,
        backend="local",
        now=dt.datetime.now(dt.UTC),
        **SPEC,
    )
    sandbox_mark_creating(sandbox_id=orphan.pk, now=dt.datetime.now(dt.UTC))
    kept = {
        in_use.sandbox_id: pid_of(sandbox_root, in_use.name),
        warm.pk: pid_of(sandbox_root, warm.name),
    }
    assert all(process_alive(pid) for pid in kept.values()) and process_alive(stray_pid)

    second = make_controller(provider=surviving(sandbox_root, spawner))  # reconciles in start()
    assert state(in_use.sandbox_id) == "in_use" and state(warm.pk) == "ready"
    assert all(process_alive(pid) for pid in kept.values())
    adopted = SandboxEvent.objects.filter(kind=events.ADOPTED)
    assert set(adopted.values_list("sandbox_id", flat=True)) == set(kept)
    # The adoptions' events are queued together and leave in one batch, not one write (and
    # one transaction) per sandbox in turn: a new leader adopting 12,000 waited on each.
    assert second.stats()["write_batches"]["largest"] >= len(kept)
    ran = execd(in_use.address, in_use.token, "/exec", {"command": "echo still here"})
    assert ran["output"].strip() == "still here"

    assert not process_alive(stray_pid) and not (sandbox_root / stray).exists()
    assert state(orphan.pk) == "deleted"
    assert SandboxEvent.objects.filter(sandbox=orphan, kind=events.BACKEND_GONE).exists()

    again = second.acquire(**acquire_args(job))  # the adopted warm pod serves the key
    assert (again.source, again.sandbox_id) == ("warm", warm.pk)
    second.release(sandbox_id=in_use.sandbox_id)
    wait_until(lambda: state(in_use.sandbox_id) == "deleted", what="adopted sandbox released")
    assert not process_alive(kept[in_use.sandbox_id])


def test_a_delete_that_failed_is_persisted_and_resumed_by_the_next_controller(
    make_controller, sandbox_root, spawner
):
    """Table 2, row 3: an unconfirmed delete survives a restart in PendingDelete."""
    job = make_job()
    failing = local_provider(
        sandbox_root, isolation="off", cls=FailingDestroyProvider, spawner=spawner
    )
    first = make_controller(provider=failing)
    got = first.acquire(**acquire_args(job))
    pid = pid_of(sandbox_root, got.name)
    first.release(sandbox_id=got.sandbox_id)
    pending = wait_until(
        lambda: PendingDelete.objects.filter(name=got.name, attempts__gte=1).first(),
        what="the failed delete recorded",
    )
    assert "injected failure" in pending.last_error and pending.sandbox_id == got.sandbox_id
    assert state(got.sandbox_id) == "deleting" and process_alive(pid)
    first.stop()
    assert failing.destroy_calls >= 1
    assert PendingDelete.objects.filter(name=got.name).exists() and process_alive(pid)

    make_controller(isolation="off")
    assert state(got.sandbox_id) == "deleted"
    assert not process_alive(pid) and not (sandbox_root / got.name).exists()
    assert PendingDelete.objects.count() == 0
    assert SandboxEvent.objects.filter(
        sandbox_id=got.sandbox_id, kind=events.DELETE_FAILED
    ).exists()


def test_sandboxes_that_died_with_the_old_controller_are_cleaned_up_not_adopted(
    make_controller, sandbox_root
):
    job = make_job()
    first = make_controller()
    got = first.acquire(**acquire_args(job))
    pid = pid_of(sandbox_root, got.name)
    first.stop()  # its loop thread ends: the local sandbox gets its parent-death signal
    wait_until(lambda: not process_alive(pid), what="the sandbox ending with its spawner")
    assert (sandbox_root / got.name).exists()  # its directory is left for the next start

    make_controller()
    assert state(got.sandbox_id) == "deleted"
    assert not (sandbox_root / got.name).exists()
    assert not SandboxEvent.objects.filter(kind=events.ADOPTED).exists()
    assert PendingDelete.objects.count() == 0


def test_an_in_use_sandbox_no_acquire_was_answered_with_is_deleted_not_adopted(
    make_controller, sandbox_root, spawner
):
    """A created pod's hand-out can commit after its acquire ended (the acquire cancelled:
    its row is finished first, so the hand-out names no row), and a controller that stops
    right then never sends the delete that follows such a hand-out (``creates.py``; seen
    in ``test_failover.py`` on a loaded host: a SIGTERMed leader's in-flight acquire). No
    trainer holds that sandbox and no retry or renew can claim it: the next controller
    deletes it. Its neighbour, handed to an answered acquire, is adopted as before.

    The rows are written through the services the controller uses, in that order."""
    job = make_job()
    answered, late = one_in_use_one_warm(make_controller, surviving(sandbox_root, spawner), job)
    late_pid = pid_of(sandbox_root, late.name)

    now = dt.datetime.now(dt.UTC)
    opened = acquisition_start(
        job_id=job.pk, role="rollout", image=IMAGE, key_hash=late.key_hash, now=now,
        idempotency_key="k-late",
    )  # fmt: skip
    acquisition_finish(
        acquisition_id=opened.pk, outcome="cancelled", now=now, detail="CancelledError: "
    )
    hand_out_created(late.pk, acquisition_id=opened.pk, now=now)
    opened.refresh_from_db()
    assert opened.sandbox_id is None  # the ended row was not rewritten: nothing names it
    assert sandboxes_unanswered(backend="local") == [late.pk]
    assert process_alive(late_pid)

    make_controller(provider=surviving(sandbox_root, spawner))  # reconciles in start()
    assert state(answered.sandbox_id) == "in_use"
    adopted = SandboxEvent.objects.filter(kind=events.ADOPTED)
    assert set(adopted.values_list("sandbox_id", flat=True)) == {answered.sandbox_id}
    taken = SandboxEvent.objects.get(sandbox_id=late.pk, kind=events.UNANSWERED)
    assert taken.detail == {"reason": "unanswered_hand_out"}
    wait_until(lambda: state(late.pk) == "deleted", what="the unanswered hand-out deleted")
    assert not process_alive(late_pid) and not (sandbox_root / late.name).exists()
    assert sandboxes_unanswered(backend="local") == []
    # the cancelled acquire's keyed retry has nothing to recover (a sandbox of its own)
    assert acquisition_recover(job_id=job.pk, key="k-late", now=now) is None
