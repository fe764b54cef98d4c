"""Hand-outs a restart cut (``sandboxes.services.recovery``, issue 12 item 5).

Rows are written through the real services in the order the controller writes them: the
acquisition opened ``pending`` with its ``Idempotency-Key``, the hand-out move that names
the sandbox on it in the same transaction, then the next controller's start ending the row
``failed``, ``service_restarted``. The retry goes through the real REST endpoint.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone

from sandboxes import events
from sandboxes.models import Acquisition, IdempotentCall, PendingDelete, Sandbox, SandboxEvent
from sandboxes.services.acquisitions import (
    SERVICE_RESTARTED,
    acquisition_record,
    acquisition_start,
    acquisitions_close_unanswered,
)
from sandboxes.services.batch import sandbox_moves_apply
from sandboxes.services.lifetimes import sandbox_renew
from sandboxes.services.moves import hand_out_move
from sandboxes.services.recovery import (
    UNCLAIMED_AFTER_RESTART,
    acquisition_recover,
    sandboxes_reclaim_unclaimed,
    sandboxes_unclaimed,
)
from sandboxes.states import AcquisitionOutcome, SandboxState
from sandboxes.tests.api_support import api, make_job, make_user, seed_sandbox
from sandboxes.tests.batch_support import hand_out_created

pytestmark = pytest.mark.django_db

GRACE_S = 60.0
SPEC = {"cpu": "1", "memory": "1Gi"}


def cut_hand_out(job, *, key: str = "k-1", restart: bool = True) -> tuple[Sandbox, Acquisition]:
    """An acquire handed a sandbox, then the service died before its row was finished."""
    now = timezone.now()
    opened = acquisition_start(
        job_id=job.pk,
        role="rollout",
        image="sandman/empty",
        key_hash="k",
        now=now,
        user_id=job.owner_id,
        idempotency_key=key,
    )
    sandbox = seed_sandbox(job)
    hand_out_created(sandbox.pk, acquisition_id=opened.pk, now=now)
    opened.refresh_from_db()
    assert opened.outcome == AcquisitionOutcome.PENDING
    assert opened.sandbox_id == sandbox.pk  # named in the hand-out's own transaction
    if restart:
        ended = acquisitions_close_unanswered(
            started_before=now + dt.timedelta(seconds=1), now=now + dt.timedelta(seconds=1)
        )
        assert ended == [opened.pk]
        opened.refresh_from_db()
    return Sandbox.objects.get(pk=sandbox.pk), opened


def test_a_retry_with_the_key_after_a_restart_gets_that_sandbox_never_a_second() -> None:
    user, token = make_user("trainer")
    job = make_job(user)
    sandbox, cut = cut_hand_out(job)
    assert cut.outcome == AcquisitionOutcome.FAILED and cut.detail.startswith(SERVICE_RESTARTED)
    assert cut.sandbox_id == sandbox.pk  # the ended row still names what it was handed
    rest = api(token)
    url = f"/api/v1/jobs/{job.pk}/acquire/"
    body = {"image": "sandman/empty", "spec": SPEC}
    first = rest.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 200, first.content
    answer = first.json()
    assert answer["sandbox_id"] == sandbox.pk and answer["token"] == sandbox.token
    assert answer["address"] == sandbox.address and answer["source"] == "created"
    assert Sandbox.objects.filter(job=job).count() == 1  # no second sandbox
    cut.refresh_from_db()
    assert cut.outcome == AcquisitionOutcome.FAILED  # an ended row is never rewritten
    ok = Acquisition.objects.get(job=job, outcome=AcquisitionOutcome.OK)
    assert ok.sandbox_id == sandbox.pk and ok.idempotency_key == "k-1"
    assert ok.detail.startswith("recovered:")
    assert sandboxes_unclaimed(backend="local") == []
    again = rest.post(url, body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert again.status_code == 200 and again.json() == answer  # the recorded answer
    assert IdempotentCall.objects.filter(route="acquire", scope=job.pk).count() == 1
    assert Acquisition.objects.filter(job=job, outcome=AcquisitionOutcome.OK).count() == 1
    later = timezone.now() + dt.timedelta(seconds=GRACE_S * 2)
    assert sandboxes_reclaim_unclaimed(backend="local", now=later, grace_s=GRACE_S) == []


def test_an_unclaimed_hand_out_waits_the_grace_then_is_taken_back_with_a_reason() -> None:
    user, _ = make_user("trainer")
    job = make_job(user)
    sandbox, cut = cut_hand_out(job)
    assert cut.finished_at is not None
    assert sandboxes_unclaimed(backend="local") == [sandbox.pk]
    early = cut.finished_at + dt.timedelta(seconds=GRACE_S - 1)
    assert sandboxes_reclaim_unclaimed(backend="local", now=early, grace_s=GRACE_S) == []
    assert Sandbox.objects.get(pk=sandbox.pk).state == SandboxState.IN_USE
    late = cut.finished_at + dt.timedelta(seconds=GRACE_S + 1)
    taken = sandboxes_reclaim_unclaimed(backend="local", now=late, grace_s=GRACE_S)
    assert [(j, s) for j, s, _ in taken] == [(job.pk, sandbox.pk)]
    ended = Sandbox.objects.get(pk=sandbox.pk)
    assert ended.state == SandboxState.DELETING
    assert PendingDelete.objects.filter(name=sandbox.name).exists()
    assert SandboxEvent.objects.filter(sandbox=ended, kind=events.UNCLAIMED).exists()
    reasons = SandboxEvent.objects.filter(sandbox=ended).values_list("detail", flat=True)
    assert any(d.get("reason") == UNCLAIMED_AFTER_RESTART for d in reasons)
    # a retry that comes after the grace does not get the taken-back sandbox
    assert acquisition_recover(job_id=job.pk, key="k-1", now=late) is None
    assert sandboxes_unclaimed(backend="local") == []


def test_a_renew_claims_a_cut_hand_out_so_it_is_never_taken_back() -> None:
    user, _ = make_user("trainer")
    job = make_job(user)
    sandbox, cut = cut_hand_out(job, key="")
    assert cut.finished_at is not None
    sandbox_renew(sandbox_id=sandbox.pk, ttl_s=600.0, now=timezone.now())
    claim = Acquisition.objects.get(sandbox=sandbox, outcome=AcquisitionOutcome.OK)
    assert claim.detail.startswith("claimed:")
    assert sandboxes_unclaimed(backend="local") == []
    late = cut.finished_at + dt.timedelta(seconds=GRACE_S + 1)
    assert sandboxes_reclaim_unclaimed(backend="local", now=late, grace_s=GRACE_S) == []
    sandbox_renew(sandbox_id=sandbox.pk, ttl_s=600.0, now=timezone.now())  # claims once
    assert Acquisition.objects.filter(sandbox=sandbox, outcome=AcquisitionOutcome.OK).count() == 1


def test_a_hand_out_whose_finish_committed_is_never_taken_back() -> None:
    """The answer may have left once the row is ``ok``: the sandbox is the trainer's."""
    user, _ = make_user("trainer")
    job = make_job(user)
    sandbox, opened = cut_hand_out(job, restart=False)
    now = timezone.now()
    acquisition_record(
        acquisition_id=opened.pk,
        job_id=job.pk,
        role="rollout",
        image="sandman/empty",
        key_hash="k",
        outcome=AcquisitionOutcome.OK,
        started_at=opened.started_at,
        now=now,
        sandbox_id=sandbox.pk,
        source="created",
    )
    assert acquisitions_close_unanswered(started_before=now, now=now) == []
    assert sandboxes_unclaimed(backend="local") == []
    later = now + dt.timedelta(seconds=GRACE_S * 10)
    assert sandboxes_reclaim_unclaimed(backend="local", now=later, grace_s=GRACE_S) == []
    assert Sandbox.objects.get(pk=sandbox.pk).state == SandboxState.IN_USE


def test_a_link_never_names_a_sandbox_on_a_row_a_later_controller_ended() -> None:
    user, _ = make_user("trainer")
    job = make_job(user)
    now = timezone.now()
    opened = acquisition_start(
        job_id=job.pk, role="rollout", image="sandman/empty", key_hash="k", now=now
    )
    acquisitions_close_unanswered(started_before=now + dt.timedelta(seconds=1), now=now)
    sandbox = seed_sandbox(job)
    sandbox_moves_apply(
        moves=[
            hand_out_move(
                sandbox_id=sandbox.pk,
                source="created",
                role="rollout",
                now=now,
                acquisition_id=opened.pk,
            )
        ]
    )
    opened.refresh_from_db()
    assert opened.outcome == AcquisitionOutcome.FAILED and opened.sandbox_id is None


def test_a_keys_first_call_costs_one_plain_read_and_a_resend_still_recovers() -> None:
    """Every keyed acquire asks for recovery first; a fresh key (every call but a resend)
    must not pay a transaction for it."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    user, _ = make_user("trainer")
    job = make_job(user)
    sandbox, _ = cut_hand_out(job, key="k-cut")
    with CaptureQueriesContext(connection) as fresh:
        assert acquisition_recover(job_id=job.pk, key="k-new", now=timezone.now()) is None
    statements = [q["sql"].split(None, 1)[0].upper() for q in fresh.captured_queries]
    assert statements == ["SELECT"]  # no SAVEPOINT (a transaction) around it
    recovered = acquisition_recover(job_id=job.pk, key="k-cut", now=timezone.now())
    assert recovered is not None and recovered.sandbox_id == sandbox.pk


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_keyed_calls_record_read_and_its_recovery_share_one_request_thread_hop(
    monkeypatch,
) -> None:
    """A keyed acquire reads its recorded answer and asks for recovery in ONE hand-off to
    the request thread (each is a thread hop and back on a web worker), the call gets the
    recovery's result; a resend replays the record with neither running again."""
    from sandboxes.apis import idempotency

    hops: list[str] = []
    real = idempotency.sync_to_async

    def counting(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(fn.__name__)
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(idempotency, "sync_to_async", counting)
    ran: list[str] = []

    def before() -> str:
        ran.append("before")
        return "recovered?"

    async def call(prior: str) -> dict[str, Any]:
        ran.append(prior)
        return {"sandbox_id": 41, "name": "sm-x"}

    kwargs = {"route": "acquire", "scope": 7, "key": "k-hop", "sandbox_of": lambda a: 41}
    try:
        answer = await idempotency.run_once(call=call, before=before, **kwargs)
        assert ran == ["before", "recovered?"]
        assert hops == ["read", "idempotent_call_record"]
        ran.clear()
        hops.clear()
        again = await idempotency.run_once(call=call, before=before, **kwargs)
        assert again == {**answer, "token": ""}  # sandbox 41 has no row: no token to give
        assert ran == [] and hops == ["read"]
    finally:  # asgiref's shared thread ran the reads: its connection goes (PostgreSQL)
        await real(connections.close_all)()
