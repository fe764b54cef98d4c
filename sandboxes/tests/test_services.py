"""Services: validated job creation, legal transitions only, persisted deletes, outcomes."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.contrib.auth import get_user_model

from sandboxes import events
from sandboxes.models import Acquisition, Job, PendingDelete, Sandbox, SandboxEvent
from sandboxes.providers.base import ReadyInfo
from sandboxes.services import (
    acquisition_finish,
    acquisition_start,
    delete_backoff_s,
    job_create,
    job_mark_drained,
    job_mark_draining,
    pending_delete_confirmed,
    pending_delete_failed,
    sandbox_begin_delete,
    sandbox_hand_out,
    sandbox_mark_creating,
    sandbox_mark_gone,
    sandbox_mark_ready,
    sandbox_release,
    sandbox_release_and_begin_delete,
    sandbox_request,
    sandbox_transition,
)
from sandboxes.tests.batch_support import TINY_REQUEST
from sandman_site.errors import AlreadyReleased, InvalidInput, InvalidTransition

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 10, 18, 8, 0, tzinfo=dt.UTC)


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


@pytest.fixture
def job() -> Job:
    owner = get_user_model().objects.create_user(username="trainer")
    return job_create(owner=owner, name="run", egress="allow", now=T0)


def requested(job: Job) -> Sandbox:
    return sandbox_request(job_id=job.pk, now=T0, **TINY_REQUEST)  # type: ignore[arg-type]


def ready(job: Job) -> Sandbox:
    sandbox = requested(job)
    sandbox_mark_creating(sandbox_id=sandbox.pk, now=at(1))
    return sandbox_mark_ready(
        sandbox_id=sandbox.pk,
        info=ReadyInfo(
            address="127.0.0.1:1",
            node="host",
            timeline={"scheduled": at(1.5), "started": at(2), "ready": at(3)},
        ),
        now=at(4),
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"rate_per_s": 0},
        {"rate_per_s": float("nan")},
        {"burst": 0},
        {"max_live": 0},
        {"max_creating": -1},
        {"warm_per_key": 2, "max_live": 1},
        {"idle_timeout_s": 0},
        {"max_lifetime_s": -5},
        {"egress": "sometimes"},
        {"name": "   "},
        {"reuse_max_uses": 0},
    ],
)
def test_a_job_with_a_bad_setting_is_refused_and_leaves_no_row(bad):
    owner = get_user_model().objects.create_user(username="t")
    kwargs = {"owner": owner, "name": "run", "now": T0, **bad}
    with pytest.raises(InvalidInput):
        job_create(**kwargs)
    assert Job.objects.count() == 0


def test_a_job_keeps_its_settings_and_defaults_to_the_papers_values():
    owner = get_user_model().objects.create_user(username="t")
    job = job_create(owner=owner, name=" run ", rate_per_s=5, burst=3, now=T0)
    job.refresh_from_db()
    assert (job.name, job.rate_per_s, job.burst, job.state) == ("run", 5.0, 3, "active")
    assert (job.idle_timeout_s, job.max_lifetime_s, job.reuse_max_uses) == (300.0, 1800.0, 8)


def test_a_job_goes_active_draining_drained_and_never_back(job):
    assert job_mark_drained(job_id=job.pk, now=at(1)) is False  # not draining yet
    assert job_mark_draining(job_id=job.pk, now=at(1)) is True
    assert job_mark_draining(job_id=job.pk, now=at(2)) is False
    assert job_mark_drained(job_id=job.pk, now=at(3)) is True
    job.refresh_from_db()
    assert job.state == "drained" and job.drained_at == at(3)


def test_the_row_exists_before_the_create_with_a_unique_dns_name_nonce_and_token(job):
    a, b = requested(job), requested(job)
    assert a.state == "requested" and a.requested_at == T0
    assert a.name != b.name and a.name.startswith(f"sm-{job.pk}-") and len(a.name) <= 63
    assert a.nonce != b.nonce and len(a.token) >= 32
    assert a.egress == "allow"  # copied from the job
    kinds = list(SandboxEvent.objects.filter(sandbox=a).values_list("kind", "detail"))
    assert kinds == [(events.STATE, {"from": "", "to": "requested"})]


def test_ready_stamps_the_times_the_backend_reported_not_the_controllers(job):
    sandbox = ready(job)
    assert sandbox.state == "ready" and sandbox.address == "127.0.0.1:1"
    assert (sandbox.scheduled_at, sandbox.started_at, sandbox.ready_at) == (at(1.5), at(2), at(3))
    kinds = set(SandboxEvent.objects.filter(sandbox=sandbox).values_list("kind", flat=True))
    assert {events.CREATE_SENT, events.SCHEDULED, events.STARTED, events.READY} <= kinds


def test_a_transition_not_in_the_map_is_refused_and_changes_nothing(job):
    sandbox = requested(job)
    before = SandboxEvent.objects.count()
    with pytest.raises(InvalidTransition):
        sandbox_transition(sandbox_id=sandbox.pk, to="in_use", now=at(1))
    sandbox.refresh_from_db()
    assert sandbox.state == "requested" and SandboxEvent.objects.count() == before


def test_a_second_release_is_already_released(job):
    sandbox = ready(job)
    sandbox_hand_out(sandbox_id=sandbox.pk, source="created", role="rollout", now=at(5))
    released = sandbox_release(sandbox_id=sandbox.pk, now=at(6), verdict="pass")
    assert released.state == "released" and released.released_at == at(6)
    with pytest.raises(AlreadyReleased):
        sandbox_release(sandbox_id=sandbox.pk, now=at(7))


def test_the_move_to_deleting_and_its_pending_delete_are_written_together(job):
    sandbox = ready(job)
    order = sandbox_begin_delete(sandbox_id=sandbox.pk, reason="released", now=at(5))
    sandbox.refresh_from_db()
    pending = PendingDelete.objects.get(name=sandbox.name)
    assert sandbox.state == "deleting" and sandbox.deleting_at == at(5)
    assert (order.name, order.nonce) == (sandbox.name, sandbox.nonce)
    assert pending.sandbox_id == sandbox.pk and pending.next_attempt_at == at(5)
    again = sandbox_begin_delete(sandbox_id=sandbox.pk, reason="again", now=at(6))
    assert again.name == order.name and PendingDelete.objects.count() == 1


def test_a_sandbox_never_sent_is_deleted_without_a_backend_call(job):
    sandbox = requested(job)
    assert sandbox_begin_delete(sandbox_id=sandbox.pk, reason="drain", now=at(1)) is None
    sandbox.refresh_from_db()
    assert sandbox.state == "deleted" and PendingDelete.objects.count() == 0


def test_a_failed_delete_backs_off_from_one_to_thirty_seconds_and_keeps_the_error(job):
    sandbox = ready(job)
    sandbox_begin_delete(sandbox_id=sandbox.pk, reason="released", now=at(5))
    for attempt in range(1, 8):
        pending_delete_failed(name=sandbox.name, error=f"boom {attempt}", now=at(10))
    pending = PendingDelete.objects.get(name=sandbox.name)
    assert pending.attempts == 7 and pending.last_error == "boom 7"
    assert pending.next_attempt_at == at(10 + 30)
    assert [delete_backoff_s(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 30, 30]
    assert SandboxEvent.objects.filter(sandbox=sandbox, kind=events.DELETE_FAILED).count() == 7
    # A delete begun again keeps its pending row (attempts, reason), whose order it gets.
    again = sandbox_begin_delete(sandbox_id=sandbox.pk, reason="again", now=at(11))
    assert again is not None and again.attempts == 7
    kept = PendingDelete.objects.get(name=sandbox.name)
    assert (kept.reason, kept.attempts, kept.created_at) == ("released", 7, at(5))


def test_a_confirmed_delete_ends_the_row_and_drops_the_pending_delete(job):
    sandbox = ready(job)
    sandbox_begin_delete(sandbox_id=sandbox.pk, reason="released", now=at(5))
    assert pending_delete_confirmed(name=sandbox.name, now=at(6)) == sandbox.pk
    sandbox.refresh_from_db()
    assert sandbox.state == "deleted" and sandbox.deleted_at == at(6)
    assert PendingDelete.objects.count() == 0
    assert pending_delete_confirmed(name=sandbox.name, now=at(7)) is None  # idempotent


def test_a_live_row_without_a_backend_sandbox_ends_deleted_through_failed(job):
    sandbox = requested(job)
    sandbox_mark_creating(sandbox_id=sandbox.pk, now=at(1))
    sandbox_mark_gone(sandbox_id=sandbox.pk, reason="no backend sandbox", now=at(2))
    sandbox.refresh_from_db()
    states = [
        d["to"]
        for d in SandboxEvent.objects.filter(sandbox=sandbox, kind=events.STATE).values_list(
            "detail", flat=True
        )
    ]
    assert sandbox.state == "deleted" and states[-2:] == ["failed", "deleted"]
    assert SandboxEvent.objects.filter(sandbox=sandbox, kind=events.BACKEND_GONE).exists()


def test_an_acquisition_outcome_is_written_once(job):
    acq = acquisition_start(job_id=job.pk, role="rollout", image="i", key_hash="k", now=T0)
    acquisition_finish(
        acquisition_id=acq.pk, outcome="ok", now=at(1), queue_ms=5, create_ms=10, wait_ms=20
    )
    with pytest.raises(InvalidTransition):
        acquisition_finish(acquisition_id=acq.pk, outcome="timeout", now=at(2))
    acq = Acquisition.objects.get(pk=acq.pk)
    assert (acq.outcome, acq.queue_ms, acq.create_ms, acq.wait_ms) == ("ok", 5, 10, 20)


def test_release_writes_the_pending_delete_in_the_same_commit_unless_kept_for_reuse(job):
    rollout = ready(job)
    sandbox_hand_out(sandbox_id=rollout.pk, source="created", role="rollout", now=at(5))
    _, order, kept = sandbox_release_and_begin_delete(
        sandbox_id=rollout.pk, now=at(6), verdict="pass", keep_grading=True
    )
    rollout.refresh_from_db()
    assert not kept and order.name == rollout.name
    assert rollout.state == "deleting" and rollout.released_at == at(6)
    assert PendingDelete.objects.filter(name=rollout.name).exists()

    grading = ready(job)
    sandbox_hand_out(sandbox_id=grading.pk, source="created", role="grading", now=at(5))
    _, order, kept = sandbox_release_and_begin_delete(
        sandbox_id=grading.pk, now=at(6), verdict="pass", keep_grading=True
    )
    grading.refresh_from_db()
    assert kept and order is None and grading.state == "released"
    assert not PendingDelete.objects.filter(name=grading.name).exists()


def _statements(queries: list[dict]) -> list[str]:
    """The data statements of a capture (transaction control left out), by verb; an
    ``executemany`` (one statement, recorded as "N times: <sql>") counts once, and the
    statements of one send (``rawinsert.Statements``: joined by ";\\n") each count."""
    sent = [re.sub(r"^\d+ times: ", "", q["sql"]) for q in queries]
    verbs = [part.split(None, 1)[0].upper() for sql in sent for part in sql.split(";\n")]
    return [v for v in verbs if v in {"SELECT", "INSERT", "UPDATE", "DELETE"}]


def _sends(queries: list[dict]) -> list[str]:
    """Each execute of a capture that holds data statements: its verbs (one round trip)."""
    return [" ".join(v) for q in queries if (v := _statements([q]))]


def _savepoints(queries: list[dict]) -> int:
    return sum(q["sql"].upper().startswith("SAVEPOINT") for q in queries)


def test_a_warm_hand_out_with_its_acquisition_is_one_lock_one_update_and_two_inserts(job):
    """The warm path's write: no second read of the row, no savepoint, one commit."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    box = requested(job)
    sandbox_mark_creating(sandbox_id=box.pk, now=at(1))
    sandbox_mark_ready(
        sandbox_id=box.pk,
        info=ReadyInfo(address="127.0.0.1:1", node="n", guards={}, timeline={}),
        now=at(2),
    )
    acquisition = {
        "job_id": job.pk,
        "role": "rollout",
        "image": "sandman/empty",
        "key_hash": "k" * 16,
        "started_at": at(3),
        "outcome": "ok",
        "queue_ms": 0.0,
        "wait_ms": 1.5,
    }
    with CaptureQueriesContext(connection) as captured:
        sandbox_hand_out(
            sandbox_id=box.pk,
            source="warm",
            role="rollout",
            now=at(3),
            healthy_at=at(3),
            acquisition=acquisition,
        )
    sends = _sends(captured.captured_queries)
    if connection.vendor == "postgresql":
        # The row's UPDATE and its events' INSERT are one send (rawinsert.Statements);
        # the acquisition (not opened before: no row to finish) is inserted by its own.
        assert sends == ["SELECT", "INSERT", "UPDATE INSERT"]
    else:
        assert sends == ["SELECT", "UPDATE", "INSERT", "INSERT"]
    # Each sent with one execute: psycopg 3's executemany is a pipeline, a round trip to
    # send and another to sync, however few its rows (the three events included).
    assert not [q["sql"] for q in captured.captured_queries if re.match(r"^\d+ times: ", q["sql"])]
    # Only the service's own block, which is a savepoint here under the test's transaction.
    assert _savepoints(captured.captured_queries) <= 1
    box.refresh_from_db()
    assert box.state == "in_use" and box.healthy_at == at(3) and box.agent_used
    kinds = list(SandboxEvent.objects.filter(sandbox=box, at=at(3)).values_list("kind", flat=True))
    assert sorted(kinds) == sorted([events.STATE, events.HEALTHY, events.ACQUIRED])
    acq = Acquisition.objects.get(sandbox=box)
    assert (acq.outcome, acq.source, acq.wait_ms) == ("ok", "warm", 1.5)


@pytest.mark.django_db(transaction=True)
def test_a_lone_acquisition_open_is_one_insert_with_no_transaction_around_it(job):
    """A lone warm acquire opens its row while the pod's health check runs, and the
    hand-out waits for it: one statement is atomic on its own, so no BEGIN and COMMIT
    (two round trips of three). Two rows are still one transaction."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from sandboxes.services.acquisitions import acquisition_open_many

    record = {
        "job_id": job.pk,
        "role": "rollout",
        "image": "sandman/empty",
        "key_hash": "k" * 16,
        "started_at": at(1),
    }
    with CaptureQueriesContext(connection) as captured:
        (opened,) = acquisition_open_many(records=[record])
    assert [q["sql"].split(None, 1)[0].upper() for q in captured.captured_queries] == ["INSERT"]
    assert Acquisition.objects.get(pk=opened.pk).outcome == "pending"
    with CaptureQueriesContext(connection) as captured:
        two = acquisition_open_many(records=[record, {**record, "started_at": at(2)}])
    verbs = [q["sql"].split(None, 1)[0].upper() for q in captured.captured_queries]
    assert verbs == ["BEGIN", "INSERT", "COMMIT"]
    assert sorted(a.started_at for a in Acquisition.objects.filter(pk__in=[a.pk for a in two])) == [
        at(1),
        at(2),
    ]


def test_a_release_and_its_delete_read_the_row_once(job):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    box = requested(job)
    sandbox_mark_creating(sandbox_id=box.pk, now=at(1))
    sandbox_mark_ready(
        sandbox_id=box.pk,
        info=ReadyInfo(address="127.0.0.1:1", node="n", guards={}, timeline={}),
        now=at(2),
    )
    sandbox_hand_out(sandbox_id=box.pk, source="warm", role="rollout", now=at(3))
    with CaptureQueriesContext(connection) as captured:
        _, order, kept = sandbox_release_and_begin_delete(sandbox_id=box.pk, now=at(4))
    reads = [
        q for q in captured.captured_queries if "sandboxes_sandbox" in q["sql"].split("FROM")[-1]
    ]
    assert _statements(reads).count("SELECT") == 1
    # The lock, the row's one UPDATE, its events, its pending delete (an INSERT that skips
    # a name already pending: no read of PendingDelete first).
    assert _statements(captured.captured_queries) == ["SELECT", "UPDATE", "INSERT", "INSERT"]
    if connection.vendor == "postgresql":  # the row's writes as one send (Statements)
        assert _sends(captured.captured_queries) == ["SELECT", "UPDATE INSERT", "INSERT"]
    assert order is not None and order.name == box.name and kept is False
    box.refresh_from_db()
    assert box.state == "deleting" and box.released_at == at(4)
    assert PendingDelete.objects.filter(name=box.name).count() == 1


def test_a_recorded_acquire_is_read_back_in_one_statement_with_its_sandboxs_token(job):
    """Every keyed acquire and release reads its record first: one statement, the token
    joined from the sandbox row (records hold none); a release's answer gets no token."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from sandboxes.selectors import idempotent_answer
    from sandboxes.services.idempotency import idempotent_call_record

    box = requested(job)
    box.refresh_from_db()
    assert box.token
    first = {"sandbox_id": box.pk, "name": box.name}
    idempotent_call_record(
        route="acquire", scope=job.pk, key="k", answer=first, sandbox_id=box.pk, now=at(1)
    )
    idempotent_call_record(
        route="release", scope=box.pk, key="k", answer={"released": True}, sandbox_id=box.pk,
        now=at(1),
    )  # fmt: skip
    with CaptureQueriesContext(connection) as captured:
        got = idempotent_answer(route="acquire", scope=job.pk, key="k")
    assert got == {**first, "token": box.token}
    assert _statements(captured.captured_queries) == ["SELECT"]
    assert idempotent_answer(route="release", scope=box.pk, key="k") == {"released": True}
    assert idempotent_answer(route="acquire", scope=job.pk, key="other") is None
    assert idempotent_answer(route="acquire", scope=job.pk + 1, key="k") is None


def test_an_idempotent_record_is_one_statement_and_the_first_answer_wins(job):
    """Every keyed acquire and release records its answer: one INSERT, no transaction;
    a second record for the same key (a racing retry) gets the first answer back."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from sandboxes.models import IdempotentCall
    from sandboxes.services.idempotency import idempotent_call_record

    first = {"sandbox_id": 7, "name": "sm-1-a"}
    with CaptureQueriesContext(connection) as captured:
        kept = idempotent_call_record(
            route="acquire", scope=job.pk, key="k", answer=first, sandbox_id=7, now=at(1)
        )
    assert kept == first
    assert _statements(captured.captured_queries) == ["INSERT"]
    assert _savepoints(captured.captured_queries) == 0
    again = idempotent_call_record(
        route="acquire", scope=job.pk, key="k", answer={"sandbox_id": 8}, sandbox_id=8, now=at(2)
    )
    assert again == first
    row = IdempotentCall.objects.get(route="acquire", scope=job.pk, key="k")
    assert (row.answer, row.sandbox_id, row.created_at) == (first, 7, at(1))
    other = idempotent_call_record(
        route="release", scope=job.pk, key="k", answer={}, sandbox_id=None, now=at(3)
    )
    assert other == {} and IdempotentCall.objects.count() == 2
