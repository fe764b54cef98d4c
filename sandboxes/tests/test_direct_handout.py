"""The direct hand-out (``SANDMAN_DIRECT_HANDOUT``): an acquire claims an offered warm pod
in PostgreSQL itself, and the controller's books follow (architecture §3.6).

Real parts throughout: the controller over the local provider with real execd processes,
PostgreSQL's row locks and LISTEN/NOTIFY, and the claim as the API runs it
(``sandboxes.apis.direct.claim``: a worker thread, execd's ``/health`` on the event loop).
Races are held at gates (a claimant's health check blocked on an event), never timed.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone

from sandboxes.apis import direct
from sandboxes.controller import Controller
from sandboxes.controller.runtime import PrewarmKey
from sandboxes.models import Acquisition, Sandbox, SandboxEvent
from sandboxes.pool import key_hash
from sandboxes.services.offers import OfferedPod, database_conninfo, sandbox_claim_offered
from sandboxes.states import AcquisitionOutcome, SandboxState
from sandboxes.tests.controller_support import IMAGE, SPEC, acquire_args, make_job, wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the direct hand-out needs SKIP LOCKED"
    ),
]

FIELDS = {"image": IMAGE, "base_commit": None, **SPEC, "role": "rollout", "timeout_s": 60.0}


@pytest.fixture
def direct_controller(make_controller: Callable[..., Controller]) -> Iterator[Controller]:
    with override_settings(SANDMAN_DIRECT_HANDOUT=True):
        yield make_controller()


def prewarm(controller: Controller, job_id: int, count: int) -> list[int]:
    """``count`` warm pods of the test key, offered (their rows stamped); their ids."""
    key = PrewarmKey(image=IMAGE, base_commit=None, count=count, **SPEC)
    controller.prewarm(job_id=job_id, keys=[key])

    def offered() -> list[int] | None:
        ids = list(
            Sandbox.objects.filter(
                job_id=job_id, state=SandboxState.READY, offered_at__isnull=False
            ).values_list("pk", flat=True)
        )
        return ids if len(ids) >= count else None

    ids = wait_until(offered, what=f"{count} offered warm pods")
    # The books count a pod offered once its stamp's commit is heard (until then it is
    # ``stamping``), and a create's last event (``warm``) may be written after the stamp:
    # a test that counts either after a claim must not race them.
    wait_until(
        lambda: books(controller, job_id)["offered"] >= count,
        what=f"the books to count {count} offered pods",
    )
    wait_until(
        lambda: SandboxEvent.objects.filter(sandbox_id__in=ids, kind="warm").count() >= count,
        what=f"the {count} pods' warm events",
    )
    return ids


def books(controller: Controller, job_id: int) -> dict[str, Any]:
    return controller.stats()["jobs"][job_id]


def claim(job_id: int, user_id: int | None = None) -> Any:
    """``direct.claim`` on a loop of its own, as one web worker request."""

    async def one() -> Any:
        try:
            return await direct.claim(
                job_id=job_id, user_id=user_id, idempotency_key="", fields=dict(FIELDS)
            )
        finally:
            await direct.close()

    return async_to_sync(one)()


def test_an_acquire_claims_an_offered_pod_in_one_commit_and_the_books_follow(
    direct_controller: Controller,
) -> None:
    job = make_job(warm_per_key=0)
    offered = prewarm(direct_controller, job.pk, 2)
    assert books(direct_controller, job.pk)["offered"] == 2
    before = Sandbox.objects.filter(job=job).count()
    oldest = Sandbox.objects.filter(pk__in=offered).order_by("offered_at", "pk")[0].pk

    result = claim(job.pk, user_id=job.owner_id)

    assert result is not None and result.source == "warm"
    assert result.sandbox_id == oldest  # the oldest offer
    first, (second,) = oldest, set(offered) - {oldest}
    row = Sandbox.objects.get(pk=first)
    assert (row.state, row.offered_at, row.source, row.agent_used) == (
        SandboxState.IN_USE,
        None,
        "warm",
        True,
    )
    assert result.token == row.token and result.address == row.address
    (acq,) = Acquisition.objects.filter(job=job)
    assert (acq.outcome, acq.sandbox_id, acq.source, acq.user_id) == (
        AcquisitionOutcome.OK,
        first,
        "warm",
        job.owner_id,
    )
    kinds = list(SandboxEvent.objects.filter(sandbox_id=first).values_list("kind", flat=True))
    assert kinds[-3:] == ["state", "healthy", "acquired"]  # the controller's own hand-out
    # The notification: the pod is in use in the books, and a replacement is built for the
    # key (a claim counts as a request of it).
    wait_until(
        lambda: books(direct_controller, job.pk)["in_use"] == 1,
        what="the books to follow the claim",
    )
    wait_until(
        lambda: Sandbox.objects.filter(job=job).count() == before + 1,
        what="a replacement build",
    )
    # The controller releases what a claimant handed out, as its own.
    direct_controller.release(sandbox_id=first)
    assert Sandbox.objects.get(pk=first).state in (SandboxState.DELETING, SandboxState.DELETED)
    assert Sandbox.objects.get(pk=second).state == SandboxState.READY


def test_concurrent_claims_never_hand_out_one_pod_twice_and_the_rest_find_none(
    direct_controller: Controller,
) -> None:
    job = make_job()
    offered = set(prewarm(direct_controller, job.pk, 3))

    def one(_: int) -> Any:
        try:
            return claim(job.pk)
        finally:
            connections.close_all()

    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(one, range(6)))

    won = [r.sandbox_id for r in results if r is not None]
    assert sorted(won) == sorted(offered)  # each offered pod once, no other
    assert results.count(None) == 3
    assert Acquisition.objects.filter(job=job, outcome=AcquisitionOutcome.OK).count() == 3


def test_the_controllers_own_acquire_withdraws_an_offer_and_loses_none_to_a_claimant(
    direct_controller: Controller,
) -> None:
    """A claimant holds the only offered pod at its health check (a gate) while the
    controller's own acquire tries to withdraw it: the withdraw waits on the row lock,
    the claim commits, and the controller follows it and creates a pod for its caller."""
    job = make_job()
    (pod_id,) = prewarm(direct_controller, job.pk, 1)
    at_check, go_on = threading.Event(), threading.Event()

    async def gated(pod: OfferedPod) -> bool:
        at_check.set()
        assert await asyncio.to_thread(go_on.wait, 60)
        return True

    record = claim_record(job.pk)

    def claimant() -> Any:
        return claim_with(record, gated)

    with ThreadPoolExecutor(max_workers=2) as pool:
        claimed = pool.submit(claimant)
        assert at_check.wait(60)
        acquired = pool.submit(lambda: direct_controller.acquire(**acquire_args(job)))
        # The controller took the pod out of its offered book and waits on the row lock.
        wait_until(
            lambda: books(direct_controller, job.pk)["offered"] == 0,
            what="the controller's withdraw to start",
        )
        assert not acquired.done()
        go_on.set()
        won = claimed.result(timeout=60)
        mine = acquired.result(timeout=120)

    assert won is not None and won.pod.sandbox_id == pod_id
    assert mine.sandbox_id != pod_id and mine.source == "created"
    assert Sandbox.objects.get(pk=pod_id).state == SandboxState.IN_USE
    wait_until(
        lambda: books(direct_controller, job.pk)["in_use"] == 2,
        what="both hand-outs in the books",
    )


def test_an_unhealthy_offered_pod_is_skipped_and_deleted_by_the_controller(
    direct_controller: Controller,
) -> None:
    job = make_job()
    offered = prewarm(direct_controller, job.pk, 2)
    ids = list(  # in the order a claimant tries them: the oldest offer first
        Sandbox.objects.filter(pk__in=offered)
        .order_by("offered_at", "pk")
        .values_list("pk", flat=True)
    )
    checked: list[int] = []

    async def first_fails(pod: OfferedPod) -> bool:
        checked.append(pod.sandbox_id)
        return pod.sandbox_id != ids[0]

    record = claim_record(job.pk)
    won = claim_with(record, first_fails)

    assert checked == ids and won is not None and won.pod.sandbox_id == ids[1]
    assert SandboxEvent.objects.filter(sandbox_id=ids[0], kind="health_failed").exists()
    wait_until(
        lambda: (
            Sandbox.objects.get(pk=ids[0]).state in (SandboxState.DELETING, SandboxState.DELETED)
        ),
        what="the controller to delete the unhealthy pod",
    )
    deleting = SandboxEvent.objects.get(sandbox_id=ids[0], kind="state", detail__to="deleting")
    assert deleting.detail["reason"] == "health_failed"


def test_a_draining_job_offers_nothing_and_its_offered_pods_are_deleted(
    direct_controller: Controller,
) -> None:
    job = make_job()
    ids = prewarm(direct_controller, job.pk, 2)
    direct_controller.drain(job_id=job.pk)

    assert claim(job.pk) is None  # the job is draining: no claim
    wait_until(
        lambda: all(
            s in (SandboxState.DELETING, SandboxState.DELETED)
            for s in Sandbox.objects.filter(pk__in=ids).values_list("state", flat=True)
        ),
        what="the drain to delete the offered pods",
    )


def test_a_starting_controller_withdraws_every_offer_before_it_reads_the_rows(
    make_controller: Callable[..., Controller],
) -> None:
    with override_settings(SANDMAN_DIRECT_HANDOUT=True):
        first = make_controller()
        job = make_job()
        ids = prewarm(first, job.pk, 1)
        first.stop()  # local sandboxes end with their controller; the stamps stay
        assert Sandbox.objects.filter(pk__in=ids, offered_at__isnull=False).exists()
        make_controller()
    assert not Sandbox.objects.filter(offered_at__isnull=False).exists()


def test_off_by_default_nothing_is_offered_and_a_claim_asks_nothing(
    make_controller: Callable[..., Controller],
) -> None:
    controller = make_controller()
    job = make_job()
    controller.prewarm(
        job_id=job.pk,
        keys=[PrewarmKey(image=IMAGE, base_commit=None, count=1, **SPEC)],
    )
    wait_until(
        lambda: Sandbox.objects.filter(job=job, state=SandboxState.READY).exists(),
        what="a warm pod",
    )
    controller.run_maintenance()
    assert not Sandbox.objects.filter(offered_at__isnull=False).exists()
    assert books(controller, job.pk)["offered"] == 0
    assert claim(job.pk) is None
    assert controller.acquire(**acquire_args(job)).source == "warm"


def release(sandbox_id: int, outcome: dict[str, Any]) -> bool:
    """``direct.release`` on a loop of its own, as one web worker request."""

    async def one() -> bool:
        try:
            return await direct.release(sandbox_id=sandbox_id, outcome=outcome)
        finally:
            await direct.close()

    return async_to_sync(one)()


def claim_with(record: dict[str, Any], healthy: Callable[[OfferedPod], Any]) -> Any:
    """``sandbox_claim_offered`` on a connection of its own, with the test's check."""
    import psycopg

    async def one() -> Any:
        async with await psycopg.AsyncConnection.connect(
            database_conninfo(), autocommit=True
        ) as conn:
            return await sandbox_claim_offered(
                conn=conn,
                record=record,
                healthy=healthy,
                now=timezone.now,
                clock=time.monotonic,
                started=time.monotonic(),
            )

    return async_to_sync(one)()


@contextlib.asynccontextmanager
async def traced_connection(path: Any) -> AsyncIterator[Any]:
    """A new autocommit connection whose libpq protocol trace (``PQtrace``, no
    timestamps) goes to ``path`` while the block runs."""
    import psycopg
    from psycopg import pq

    async with await psycopg.AsyncConnection.connect(database_conninfo(), autocommit=True) as conn:
        with path.open("w") as sink:
            conn.pgconn.trace(sink.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                yield conn
            finally:
                conn.pgconn.untrace()  # flushes libpq's stream


def round_trips(trace: str) -> int:
    """Round trips in a libpq protocol trace: each run of the client's messages (``F``)
    that the server's (``B``) then answer is one wait for the server."""
    trips, sending = 0, False
    for line in trace.splitlines():
        direction = line.split("\t", 1)[0]
        if direction == "F":
            sending = True
        elif direction == "B" and sending:
            trips, sending = trips + 1, False
    return trips


def test_a_claim_and_a_release_each_wait_for_the_database_twice(
    direct_controller: Controller, tmp_path: Any
) -> None:
    """Counted from libpq's own protocol trace (``PQtrace``) of the claimant's connection:
    ``BEGIN`` and the row lock answered together, then the writes and ``COMMIT`` together;
    the health check runs between the two, with the row locked (another session's
    ``NOWAIT`` lock of it fails then). A release: the same."""
    import psycopg
    from psycopg import errors, pq

    from sandboxes.services.offers import sandbox_release_direct
    from sandman_site.errors import AlreadyReleased

    job = make_job()
    prewarm(direct_controller, job.pk, 1)
    locked_at_check: list[bool] = []

    async def healthy(pod: OfferedPod) -> bool:
        with psycopg.connect(database_conninfo(), autocommit=True) as other:
            try:
                other.execute(
                    "SELECT id FROM sandboxes_sandbox WHERE id = %s FOR UPDATE NOWAIT",
                    [pod.sandbox_id],
                )
                locked_at_check.append(False)
            except errors.LockNotAvailable:
                locked_at_check.append(True)
        return True

    async def traced(conn: Any, name: str, call: Any) -> tuple[Any, int]:
        path = tmp_path / name
        with path.open("w") as sink:
            conn.pgconn.trace(sink.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                result = await call()
            finally:
                conn.pgconn.untrace()  # flushes libpq's stream
        return result, round_trips(path.read_text())

    async def one() -> tuple[Any, int, int]:
        async with await psycopg.AsyncConnection.connect(
            database_conninfo(), autocommit=True
        ) as conn:
            claimed, claim_trips = await traced(
                conn,
                "claim.trace",
                lambda: sandbox_claim_offered(
                    conn=conn,
                    record=claim_record(job.pk),
                    healthy=healthy,
                    now=timezone.now,
                    clock=time.monotonic,
                    started=time.monotonic(),
                ),
            )
            assert claimed is not None
            _, release_trips = await traced(
                conn,
                "release.trace",
                lambda: sandbox_release_direct(
                    conn=conn, sandbox_id=claimed.pod.sandbox_id, now=timezone.now()
                ),
            )
            # A refusal raised inside the transaction rolls it back: the connection is
            # idle and usable again (the pool hands it to the next claim).
            with pytest.raises(AlreadyReleased):
                await sandbox_release_direct(
                    conn=conn, sandbox_id=claimed.pod.sandbox_id, now=timezone.now()
                )
            assert conn.info.transaction_status == pq.TransactionStatus.IDLE
            assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
            return claimed, claim_trips, release_trips

    claimed, claim_trips, release_trips = async_to_sync(one)()

    assert locked_at_check == [True]
    assert (claim_trips, release_trips) == (2, 2)
    row = Sandbox.objects.get(pk=claimed.pod.sandbox_id)  # both committed
    assert row.state in (SandboxState.DELETING, SandboxState.DELETED)
    assert Acquisition.objects.get(job=job).sandbox_id == row.pk


def claim_record(job_id: int) -> dict[str, Any]:
    """An acquisition's fields, as ``direct.claim`` passes them."""
    return {
        "job_id": job_id,
        "user_id": None,
        "role": "rollout",
        "image": IMAGE,
        "key_hash": key_hash_of_fields(),
        "started_at": timezone.now(),
        "idempotency_key": "",
    }


def key_hash_of_fields() -> str:
    from sandboxes.pool import PoolKey

    return key_hash(
        PoolKey(
            image=IMAGE,
            base_commit=None,
            cpu_millis=SPEC["cpu_millis"],
            memory_bytes=SPEC["memory_bytes"],
            workspace_bytes=SPEC["workspace_bytes"],
        )
    )


@dataclass
class RestJob:
    """A trainer's token and job with offered pods, and the fast path in front of Django."""

    token: str
    job: Any
    offered: list[int]
    app: Any  # Django's handler, recording the paths that reached it
    fast: Any
    acquire: str
    body: dict[str, Any]


async def rest_job(controller: Controller, settings: Any, offers: int) -> RestJob:
    from sandboxes.apis import access
    from sandboxes.apis.fastpath import hot_routes
    from sandboxes.services.jobs import job_create
    from sandboxes.tests.api_support import make_user
    from sandboxes.tests.test_api_fastpath import Recorder

    settings.SANDMAN_API_TOKEN_TTL_S = 600.0  # the token stays known through the test
    access.clear()
    user, token = await sync_to_async(make_user)("trainer")
    job = await sync_to_async(job_create)(owner=user, name="d", egress="allow", now=timezone.now())
    offered = await sync_to_async(prewarm)(controller, job.pk, offers)
    app = Recorder()
    return RestJob(
        token=token,
        job=job,
        offered=offered,
        app=app,
        fast=hot_routes(app),
        acquire=f"/api/v1/jobs/{job.pk}/acquire/",
        body={"image": IMAGE, "spec": {"cpu": "500m", "memory": "256Mi"}, "timeout_s": 60},
    )


@pytest.mark.asyncio
async def test_a_keyed_rest_acquire_is_claimed_on_the_fast_path_and_its_resend_replayed(
    direct_controller: Controller, settings: Any
) -> None:
    """Over the ASGI fast path, as a trainer's client calls it: the claim answers the
    acquire (Django never reached), the key is on the acquisition, a resend with the key
    gets the same sandbox with no second claim, and the release goes to the controller."""
    from sandboxes.tests.test_api_fastpath import post

    rest = await rest_job(direct_controller, settings, 1)
    token, job, (offered,), app, fast = rest.token, rest.job, rest.offered, rest.app, rest.fast
    acquire, body = rest.acquire, rest.body
    keyed = [(b"idempotency-key", b"k-direct-1")]
    try:
        status, _, first = await post(fast, acquire, token, body, extra=keyed)
        assert status == 200, first
        assert (first["sandbox_id"], first["source"]) == (offered, "warm")
        status, _, resent = await post(fast, acquire, token, body, extra=keyed)
        assert (status, resent) == (200, first)  # the recorded answer, no second claim
        assert app.paths == []  # the fast path answered both; Django was never reached

        def on_record() -> list[tuple[Any, ...]]:
            return list(
                Acquisition.objects.filter(job=job).values_list(
                    "outcome", "sandbox_id", "idempotency_key"
                )
            )

        assert await sync_to_async(on_record)() == [("ok", offered, "k-direct-1")]
        release = f"/api/v1/sandboxes/{offered}/release/"
        keyed_release = [(b"idempotency-key", b"k-direct-release")]
        status, _, released = await post(fast, release, token, extra=keyed_release)
        assert (status, released) == (200, {"sandbox_id": offered, "released": True})

        def state() -> str:
            return Sandbox.objects.get(pk=offered).state

        # Released without the controller; it deleted the sandbox on the notification.
        assert await sync_to_async(state)() in (SandboxState.DELETING, SandboxState.DELETED)
        assert app.paths == []
        # A resend of the keyed release is replayed from the record written with the
        # release (the sandbox is no longer this process's, so Django's view answers it).
        status, _, again = await post(fast, release, token, extra=keyed_release)
        assert (status, again) == (200, released)
        status, _, unkeyed = await post(fast, release, token)
        assert (status, unkeyed["error"]) == (409, "already_released")
    finally:
        await direct.close()
        await sync_to_async(connections.close_all)()


def test_a_direct_release_deletes_through_the_controller_and_refuses_a_second_release(
    direct_controller: Controller,
) -> None:
    from sandman_site.errors import AlreadyReleased

    job = make_job()
    prewarm(direct_controller, job.pk, 1)
    won = claim(job.pk)
    wait_until(lambda: books(direct_controller, job.pk)["in_use"] == 1, what="the claim")

    assert release(sandbox_id=won.sandbox_id, outcome={}) is True

    # The notification carried the delete's order: the controller sends it and forgets it.
    wait_until(
        lambda: Sandbox.objects.get(pk=won.sandbox_id).state == SandboxState.DELETED,
        what="the controller to delete the released sandbox",
    )
    assert books(direct_controller, job.pk)["in_use"] == 0
    with pytest.raises(AlreadyReleased):
        release(sandbox_id=won.sandbox_id, outcome={})
    # A release with a verdict is the controller's (it may keep a grading pod for reuse).
    assert release(sandbox_id=won.sandbox_id, outcome={"verdict": "pass"}) is False


def test_a_release_whose_notification_is_lost_is_followed_by_the_next_round(
    make_controller: Callable[..., Controller],
) -> None:
    """The row released behind the books with no notification (as a dropped LISTEN
    connection would lose it): the round forgets the pod and resumes its stored delete."""
    from sandboxes.services.batch_deletes import ReleaseRequest, sandbox_release_many

    with override_settings(SANDMAN_DIRECT_HANDOUT=True):
        controller = make_controller(maintenance_interval_s=None)
        job = make_job()
        prewarm(controller, job.pk, 1)
        won = claim(job.pk)
        wait_until(lambda: books(controller, job.pk)["in_use"] == 1, what="the claim")
        (answer,) = sandbox_release_many(
            requests=[ReleaseRequest(sandbox_id=won.sandbox_id, now=timezone.now())]
        )
        assert not isinstance(answer, Exception)
        assert books(controller, job.pk)["in_use"] == 1  # nobody told the books

        controller.run_maintenance()

        assert books(controller, job.pk)["in_use"] == 0
        wait_until(
            lambda: Sandbox.objects.get(pk=won.sandbox_id).state == SandboxState.DELETED,
            what="the stored delete resumed",
        )


def test_an_idle_offer_is_withdrawn_and_trimmed_and_never_offered_again(
    make_controller: Callable[..., Controller],
) -> None:
    """The same idle rule as the controller's own warm pods (a key idle past the job's
    ``idle_timeout_s`` loses its pods), on a fake clock: withdrawn, then trimmed, in one
    round; an idle pod is not offered again on the way."""
    from sandboxes import events
    from standin.clock import FakeClock

    clock = FakeClock()
    with override_settings(SANDMAN_DIRECT_HANDOUT=True):
        controller = make_controller(
            clock=clock.monotonic, now=clock.now, sleep=clock.sleep, maintenance_interval_s=None
        )
        job = make_job(idle_timeout_s=300)
        (pod_id,) = prewarm(controller, job.pk, 1)
        clock.advance(299)
        assert controller.run_maintenance()["trimmed"] == 0
        assert books(controller, job.pk)["offered"] == 1
        clock.advance(1)

        counts = controller.run_maintenance()

        assert counts["trimmed"] == 1
        assert books(controller, job.pk)["offered"] == 0
        assert claim(job.pk) is None
        wait_until(
            lambda: Sandbox.objects.get(pk=pod_id).state == SandboxState.DELETED,
            what="the trimmed pod deleted",
        )
        assert SandboxEvent.objects.filter(sandbox_id=pod_id, kind=events.TRIMMED).exists()
        assert Sandbox.objects.get(pk=pod_id).offered_at is None


def test_an_acquire_at_the_cap_evicts_an_offered_pod_of_another_key_as_a_warm_one(
    direct_controller: Controller,
) -> None:
    """The controller's rule at ``max_live`` (the longest-idle warm pod of ANOTHER key is
    deleted to make room, ``pool.admit``) holds when that pod is offered: the offer is
    withdrawn first, then the pod is evicted; the acquire gets a new sandbox, not 429."""
    from sandboxes import events

    job = make_job(max_live=2)
    offered = set(prewarm(direct_controller, job.pk, 2))
    other = acquire_args(job, cpu_millis=SPEC["cpu_millis"] * 2)  # another key

    result = direct_controller.acquire(**other)

    assert result.source == "created"
    evicted = [
        pk
        for pk in offered
        if SandboxEvent.objects.filter(sandbox_id=pk, kind=events.EVICTED).exists()
    ]
    assert len(evicted) == 1
    (kept,) = offered - set(evicted)
    wait_until(
        lambda: Sandbox.objects.get(pk=evicted[0]).state == SandboxState.DELETED,
        what="the evicted pod deleted",
    )
    assert Sandbox.objects.get(pk=evicted[0]).offered_at is None  # withdrawn, never claimable
    assert Sandbox.objects.get(pk=kept).offered_at is not None  # the other offer stands
    assert books(direct_controller, job.pk)["offered"] == 1


def keyed_claim(job_id: int, key: str, healthy: Callable[[OfferedPod], Any]) -> Any:
    """``sandbox_claim_offered`` for a keyed acquire, on a connection of its own."""
    import psycopg

    from sandboxes.services.offers import KeyedClaim

    def answer(pod: OfferedPod, wait_ms: float) -> dict[str, Any]:
        return {"sandbox_id": pod.sandbox_id, "name": pod.name, "wait_ms": wait_ms}

    async def one() -> Any:
        async with await psycopg.AsyncConnection.connect(
            database_conninfo(), autocommit=True
        ) as conn:
            return await sandbox_claim_offered(
                conn=conn,
                record={**claim_record(job_id), "idempotency_key": key},
                healthy=healthy,
                now=timezone.now,
                clock=time.monotonic,
                started=time.monotonic(),
                keyed=KeyedClaim(key=key, answer=answer),
            )

    return async_to_sync(one)()


async def _healthy(pod: OfferedPod) -> bool:
    return True


def test_a_keyed_claim_records_its_answer_in_the_hand_outs_commit_and_a_resend_claims_none(
    direct_controller: Controller,
) -> None:
    """The key's answer is written with the hand-out (one commit: both or neither), and a
    second call with the key finds its history with the lock and claims nothing."""
    from sandboxes.models import IdempotentCall
    from sandboxes.services.offers import KeySeen

    job = make_job()
    offered = prewarm(direct_controller, job.pk, 2)

    won = keyed_claim(job.pk, "key-1", _healthy)

    call = IdempotentCall.objects.get(route="acquire", scope=job.pk, key="key-1")
    assert call.sandbox_id == won.pod.sandbox_id and "token" not in call.answer
    assert call.answer["sandbox_id"] == won.pod.sandbox_id
    (acq,) = Acquisition.objects.filter(job=job)
    assert (acq.sandbox_id, acq.idempotency_key) == (won.pod.sandbox_id, "key-1")
    with pytest.raises(KeySeen):
        keyed_claim(job.pk, "key-1", _healthy)
    (left,) = set(offered) - {won.pod.sandbox_id}
    assert Sandbox.objects.get(pk=left).offered_at is not None  # still offered, unclaimed
    assert Acquisition.objects.filter(job=job).count() == 1


def test_a_key_recorded_before_the_claim_stops_it_with_nothing_claimed(
    direct_controller: Controller,
) -> None:
    """Another call recorded the key first: the claim's lock finds the key taken
    (``idempotent_calls_hold`` returns nothing for it), so nothing of the claim is written
    -- the pod offered, no acquisition, no event -- and the caller hears ``KeySeen``."""
    import psycopg

    from sandboxes.models import IdempotentCall
    from sandboxes.services.offers import KeySeen

    job = make_job()
    (pod_id,) = prewarm(direct_controller, job.pk, 1)
    events_before = SandboxEvent.objects.filter(sandbox_id=pod_id).count()
    with psycopg.connect(database_conninfo(), autocommit=True) as other:
        other.execute(
            "INSERT INTO sandboxes_idempotentcall (route, scope, key, sandbox_id, answer,"
            " created_at) VALUES ('acquire', %s, 'key-2', NULL, '{}', now())",
            [job.pk],
        )

    with pytest.raises(KeySeen):
        keyed_claim(job.pk, "key-2", _healthy)

    row = Sandbox.objects.get(pk=pod_id)
    assert (row.state, row.offered_at is not None) == (SandboxState.READY, True)
    assert not Acquisition.objects.filter(job=job).exists()
    assert SandboxEvent.objects.filter(sandbox_id=pod_id).count() == events_before
    assert IdempotentCall.objects.get(key="key-2").sandbox_id is None  # the other call's
    assert books(direct_controller, job.pk)["offered"] == 1  # no claim was notified


def test_a_call_that_records_the_key_while_a_claim_holds_it_waits_and_gets_the_claims_answer(
    direct_controller: Controller,
) -> None:
    """The claim takes its key with its lock, in its own transaction. Another call with the
    key (the usual path's record, ``idempotent_call_record``) that comes while the claim
    is at its health check waits on that key (seen in ``pg_stat_activity``), and once the
    claim commits gets the claim's answer: one hand-out, one answer for the key."""
    import psycopg

    from sandboxes.models import IdempotentCall
    from sandboxes.services.idempotency import idempotent_call_record

    job = make_job()
    (pod_id,) = prewarm(direct_controller, job.pk, 1)
    other: dict[str, Any] = {}

    def record_other() -> None:
        try:
            other["answer"] = idempotent_call_record(
                route="acquire", scope=job.pk, key="key-3", answer={"other": True},
                sandbox_id=None, now=timezone.now(),
            )  # fmt: skip
        finally:
            connections.close_all()

    def other_waits_on_a_lock() -> bool:
        # A connection of its own, closed at once: it is asked from a worker thread, where
        # a Django connection would outlive the test and hold the test database open.
        with psycopg.connect(database_conninfo(), autocommit=True) as conn:
            (waiting,) = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE 'INSERT INTO %sandboxes_idempotentcall%'"
            ).fetchone()
            return waiting == 1

    thread = threading.Thread(target=record_other)

    async def another_call_comes(pod: OfferedPod) -> bool:
        thread.start()
        await sync_to_async(wait_until, thread_sensitive=False)(
            other_waits_on_a_lock, what="the other call to wait on the claim's key"
        )
        return True

    won = keyed_claim(job.pk, "key-3", another_call_comes)
    thread.join()

    assert won.pod.sandbox_id == pod_id
    call = IdempotentCall.objects.get(route="acquire", scope=job.pk, key="key-3")
    assert call.sandbox_id == pod_id and other["answer"] == call.answer
    assert other["answer"]["sandbox_id"] == pod_id
    assert Acquisition.objects.get(job=job).sandbox_id == pod_id


@pytest.mark.asyncio
async def test_a_direct_claim_on_a_connection_the_server_dropped_is_a_503_and_the_next_works(
    direct_controller: Controller, settings: Any
) -> None:
    """The loop's pool holds a connection PostgreSQL has since terminated (a restart, a
    failover, ``pg_terminate_backend``): the claim fails on it before anything is handed
    out, and the caller gets the views' ``503 database_unavailable``, never a 500; the pool
    drops the dead connection and the next acquire is claimed."""
    import psycopg

    from sandboxes.tests.test_api_fastpath import post

    rest = await rest_job(direct_controller, settings, 3)
    token, job, fast, acquire, body = rest.token, rest.job, rest.fast, rest.acquire, rest.body
    offered = set(rest.offered)
    try:
        status, _, first = await post(fast, acquire, token, body)
        assert status == 200 and first["sandbox_id"] in offered, first  # the pool is open
        # Every connection the pool opens at its start is in it (psycopg_pool's ``wait``),
        # and each terminated backend has exited before the next claim (with a timeout,
        # ``pg_terminate_backend`` is true only then: PostgreSQL 14+, "Server Signaling
        # Functions"). Without both, a connection still being opened when the backends
        # were ended joined the pool after the check that follows the first failure, and
        # the next claim met it dead (a 503 where a 200 was due, on a loaded machine).
        await (await direct._handles().pool()).wait(timeout=30)
        with psycopg.connect(database_conninfo(), autocommit=True) as admin:
            ended = admin.execute(
                "SELECT pg_terminate_backend(pid, 30000) FROM pg_stat_activity"
                " WHERE application_name = %s",
                [direct.APPLICATION_NAME],
            ).fetchall()
        assert ended and all(ok for (ok,) in ended)

        status, headers, lost = await post(fast, acquire, token, body)

        assert (status, lost["error"]) == (503, "database_unavailable"), lost
        assert headers["retry-after"] == "1"
        status, _, second = await post(fast, acquire, token, body)
        assert status == 200 and second["sandbox_id"] in offered - {first["sandbox_id"]}

        def handed() -> int:
            return Acquisition.objects.filter(job=job).count()

        assert await sync_to_async(handed)() == 2  # nothing recorded for the lost call
    finally:
        await direct.close()
        await sync_to_async(connections.close_all)()


def test_a_keyed_direct_release_records_its_answer_in_its_commit_and_a_recorded_key_stops_it(
    direct_controller: Controller,
) -> None:
    """The release's answer is recorded with the release (one commit); a key already
    recorded for the sandbox (a resend) is found with the lock, and nothing is released."""
    import psycopg

    from sandboxes.models import IdempotentCall
    from sandboxes.services.offers import KeySeen, sandbox_release_direct

    job = make_job()
    prewarm(direct_controller, job.pk, 2)
    first, second = claim(job.pk), claim(job.pk)
    answer = {"sandbox_id": first.sandbox_id, "released": True}

    async def release_keyed(sandbox_id: int, key: str) -> None:
        async with await psycopg.AsyncConnection.connect(
            database_conninfo(), autocommit=True
        ) as conn:
            await sandbox_release_direct(
                conn=conn, sandbox_id=sandbox_id, now=timezone.now(), key=key, answer=answer
            )

    async_to_sync(release_keyed)(first.sandbox_id, "r-1")

    call = IdempotentCall.objects.get(route="release", scope=first.sandbox_id, key="r-1")
    assert call.answer == answer
    assert Sandbox.objects.get(pk=first.sandbox_id).state != SandboxState.IN_USE
    IdempotentCall.objects.create(
        route="release", scope=second.sandbox_id, key="r-2", answer={}, created_at=timezone.now()
    )
    with pytest.raises(KeySeen):
        async_to_sync(release_keyed)(second.sandbox_id, "r-2")
    assert Sandbox.objects.get(pk=second.sandbox_id).state == SandboxState.IN_USE


def _connections_to(port: int) -> int:
    """This process's TCP sockets connected to 127.0.0.1:``port`` (from /proc: the
    sockets among its file descriptors, matched to the kernel's table of IPv4 sockets)."""
    import os

    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    with open("/proc/self/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if inode in inodes and state == "01" and int(remote.split(":")[1], 16) == port:
                count += 1
    return count


def test_a_claims_health_check_keeps_no_connection_to_the_pod_it_handed_out(
    direct_controller: Controller,
) -> None:
    """A web worker checks each pod once, when it claims it: a kept-alive connection would
    hold a socket here and an execd thread in the sandbox for as long
    as it is in use (thousands at scale), for nothing."""
    job = make_job()
    (pod_id,) = prewarm(direct_controller, job.pk, 1)
    port = int(Sandbox.objects.get(pk=pod_id).address.rsplit(":", 1)[1])
    before = _connections_to(port)  # the controller's own, in this test's process

    async def one() -> tuple[Any, int]:
        try:
            won = await direct.claim(
                job_id=job.pk, user_id=None, idempotency_key="", fields=dict(FIELDS)
            )
            assert won is not None
            return won, _connections_to(port)
        finally:
            await direct.close()

    won, held = async_to_sync(one)()

    assert (won.sandbox_id, won.source) == (pod_id, "warm")
    assert held == before


# --- many calls at once: the web worker's group commit (sandboxes.apis.batches) ----------------


def claim_many_with(
    records: list[dict[str, Any]],
    healthy: Callable[[OfferedPod], Any],
    wanted: Callable[[int], bool] | None = None,
    trace: Any = None,
    keys: list[Any] | None = None,
) -> tuple[list[Any], int]:
    """``sandbox_claim_offered_many`` on a connection of its own; with ``trace`` (a path)
    the round trips it waited for, counted from libpq's protocol trace."""
    import psycopg
    from psycopg import pq

    from sandboxes.services.offers import sandbox_claim_offered_many

    async def one() -> tuple[list[Any], int]:
        async with await psycopg.AsyncConnection.connect(
            database_conninfo(), autocommit=True
        ) as conn:
            if trace is not None:
                sink = trace.open("w")
                conn.pgconn.trace(sink.fileno())
                conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                now = time.monotonic()
                claimed = await sandbox_claim_offered_many(
                    conn=conn,
                    records=records,
                    starts=[now] * len(records),
                    healthy=healthy,
                    now=timezone.now,
                    clock=time.monotonic,
                    wanted=wanted,
                    keys=keys,
                )
            finally:
                if trace is not None:
                    conn.pgconn.untrace()
                    sink.close()
            return claimed, round_trips(trace.read_text()) if trace is not None else 0

    return async_to_sync(one)()


def test_claims_sent_together_take_the_two_round_trips_of_one_and_the_oldest_offers(
    direct_controller: Controller, tmp_path: Any
) -> None:
    """Three acquires of one job and key in one batch: one lock of three rows, three checks,
    one ``COMMIT`` with three hand-outs, their acquisitions and notifications. The first
    record gets the oldest offer; the books hear of all three."""
    job = make_job(warm_per_key=0)
    offered = prewarm(direct_controller, job.pk, 3)
    oldest_first = list(
        Sandbox.objects.filter(pk__in=offered)
        .order_by("offered_at", "pk")
        .values_list("pk", flat=True)
    )
    checked: list[int] = []

    async def healthy(pod: OfferedPod) -> bool:
        checked.append(pod.sandbox_id)
        return True

    records = [claim_record(job.pk) for _ in range(3)]
    claimed, trips = claim_many_with(records, healthy, trace=tmp_path / "many.trace")

    assert trips == 2
    assert [c.pod.sandbox_id for c in claimed] == oldest_first
    assert sorted(checked) == sorted(offered)
    acquisitions = {a.sandbox_id: a for a in Acquisition.objects.filter(job=job)}
    assert set(acquisitions) == set(offered)
    for won in claimed:
        row = Sandbox.objects.get(pk=won.pod.sandbox_id)
        assert (row.state, row.offered_at, row.source) == (SandboxState.IN_USE, None, "warm")
        assert won.pod.token == row.token and won.pod.address == row.address
        assert acquisitions[row.pk].outcome == AcquisitionOutcome.OK
        assert acquisitions[row.pk].wait_ms == pytest.approx(won.wait_ms)
        kinds = list(SandboxEvent.objects.filter(sandbox_id=row.pk).values_list("kind", flat=True))
        assert kinds[-3:] == ["state", "healthy", "acquired"]
    wait_until(
        lambda: books(direct_controller, job.pk)["in_use"] == 3,
        what="the books to follow the three claims",
    )


def test_in_a_batch_a_failed_check_sends_its_claim_to_the_next_offer_and_none_left_is_none(
    direct_controller: Controller,
) -> None:
    """Three offers, the oldest unhealthy, four claims: the two healthy offers go to the
    first two claims; the third (whose offer failed) tries again and finds the fourth's
    share, none: both get None, as a lone claim with nothing offered does."""
    job = make_job(warm_per_key=0)
    offered = prewarm(direct_controller, job.pk, 3)
    ids = list(
        Sandbox.objects.filter(pk__in=offered)
        .order_by("offered_at", "pk")
        .values_list("pk", flat=True)
    )

    async def oldest_fails(pod: OfferedPod) -> bool:
        return pod.sandbox_id != ids[0]

    claimed, _ = claim_many_with([claim_record(job.pk) for _ in range(4)], oldest_fails)

    assert [c.pod.sandbox_id if c else None for c in claimed] == [ids[1], ids[2], None, None]
    assert SandboxEvent.objects.filter(sandbox_id=ids[0], kind="health_failed").exists()
    assert Sandbox.objects.get(pk=ids[0]).offered_at is None
    assert Acquisition.objects.filter(job=job).count() == 2


def test_a_claim_whose_caller_left_during_its_batch_leaves_its_offer_offered(
    direct_controller: Controller,
) -> None:
    job = make_job(warm_per_key=0)
    offered = prewarm(direct_controller, job.pk, 2)
    ids = list(
        Sandbox.objects.filter(pk__in=offered)
        .order_by("offered_at", "pk")
        .values_list("pk", flat=True)
    )

    async def healthy(pod: OfferedPod) -> bool:
        return True

    claimed, _ = claim_many_with(
        [claim_record(job.pk) for _ in range(2)], healthy, wanted=lambda i: i != 0
    )

    assert claimed[0] is None and claimed[1].pod.sandbox_id == ids[0]  # the oldest offer
    left = Sandbox.objects.get(pk=ids[1])
    assert (left.state, left.offered_at is not None) == (SandboxState.READY, True)
    assert Acquisition.objects.filter(job=job).count() == 1


def test_releases_sent_together_each_get_their_own_answer_in_two_round_trips(
    direct_controller: Controller, tmp_path: Any
) -> None:
    """Two claimed sandboxes released in one batch with a second release of the first and
    an id that does not exist: released, ``already_released`` (as if sent after the
    first), not found, released; one lock, one ``COMMIT``; the controller deletes both."""

    from sandboxes.services.offers import sandbox_release_direct_many
    from sandman_site.errors import AlreadyReleased, NotFound

    job = make_job(warm_per_key=0)
    prewarm(direct_controller, job.pk, 2)

    async def healthy(pod: OfferedPod) -> bool:
        return True

    claimed, _ = claim_many_with([claim_record(job.pk) for _ in range(2)], healthy)
    first, second = (c.pod.sandbox_id for c in claimed)
    missing = max(first, second) + 1000
    path = tmp_path / "release.trace"

    async def one() -> list[Any]:
        async with traced_connection(path) as conn:
            return await sandbox_release_direct_many(
                conn=conn, sandbox_ids=[first, first, missing, second], now=timezone.now()
            )

    answers = async_to_sync(one)()

    assert round_trips(path.read_text()) == 2
    assert answers[0] is None and answers[3] is None
    assert isinstance(answers[1], AlreadyReleased) and isinstance(answers[2], NotFound)
    for sandbox_id in (first, second):
        wait_until(
            lambda sandbox_id=sandbox_id: (
                Sandbox.objects.get(pk=sandbox_id).state == SandboxState.DELETED
            ),
            what=f"the controller to delete released sandbox {sandbox_id}",
        )
    assert books(direct_controller, job.pk)["in_use"] == 0


def test_claims_and_releases_on_one_loop_go_through_the_batches_and_hand_out_each_pod_once(
    direct_controller: Controller,
) -> None:
    """``direct.claim`` and ``direct.release`` as one web worker's requests under a burst:
    five acquires at once on one loop for three offered pods (real execd checks), then the
    three releases at once."""
    job = make_job(warm_per_key=0)
    offered = set(prewarm(direct_controller, job.pk, 3))

    async def burst() -> tuple[list[Any], list[bool]]:
        try:
            won = await asyncio.gather(
                *(
                    direct.claim(
                        job_id=job.pk, user_id=None, idempotency_key="", fields=dict(FIELDS)
                    )
                    for _ in range(5)
                )
            )
            released = await asyncio.gather(
                *(direct.release(sandbox_id=w.sandbox_id, outcome={}) for w in won if w)
            )
            return won, released
        finally:
            await direct.close()

    won, released = async_to_sync(burst)()

    assert sorted(w.sandbox_id for w in won if w) == sorted(offered)
    assert [w for w in won if w is None] == [None, None]
    assert released == [True, True, True]
    assert Acquisition.objects.filter(job=job, outcome=AcquisitionOutcome.OK).count() == 3
    # One batch: the three hand-outs were written by one transaction (the rows' xmin).
    with connection.cursor() as cur:
        cur.execute(
            "SELECT DISTINCT xmin::text FROM sandboxes_acquisition WHERE job_id = %s", [job.pk]
        )
        assert len(cur.fetchall()) == 1
    wait_until(
        lambda: (
            set(Sandbox.objects.filter(pk__in=offered).values_list("state", flat=True))
            <= {SandboxState.DELETING, SandboxState.DELETED}
        ),
        what="the three released sandboxes to be deleted",
    )


def test_keyed_claims_in_one_batch_each_hold_their_key_and_one_key_twice_is_claimed_once(
    direct_controller: Controller,
) -> None:
    """Three keyed claims in one batch, the third with the first's key: the first two are
    handed out with their keys' answers in the commit; the third is a resend of the first
    (``KeySeen``), and its pod stays offered."""
    from sandboxes.models import IdempotentCall
    from sandboxes.services.offers import KeyedClaim, KeySeen

    job = make_job(warm_per_key=0)
    offered = prewarm(direct_controller, job.pk, 3)

    def answer(pod: OfferedPod, wait_ms: float) -> dict[str, Any]:
        return {"sandbox_id": pod.sandbox_id}

    keys = [KeyedClaim(key=k, answer=answer) for k in ("k-a", "k-b", "k-a")]
    records = [{**claim_record(job.pk), "idempotency_key": k.key} for k in keys]
    claimed, _ = claim_many_with(records, _healthy, keys=keys)

    first, second, third = claimed
    assert isinstance(third, KeySeen) and third.args == ("k-a",)
    for key, won in (("k-a", first), ("k-b", second)):
        call = IdempotentCall.objects.get(route="acquire", scope=job.pk, key=key)
        assert call.sandbox_id == won.pod.sandbox_id == call.answer["sandbox_id"]
    assert IdempotentCall.objects.filter(scope=job.pk).count() == 2
    (left,) = set(offered) - {first.pod.sandbox_id, second.pod.sandbox_id}
    assert Sandbox.objects.get(pk=left).offered_at is not None


def test_one_release_key_twice_in_a_batch_is_released_once_and_its_answer_kept(
    direct_controller: Controller, tmp_path: Any
) -> None:
    """As for claims: the first release of a key in a batch holds it and is released; a
    later one with the same sandbox and key is a resend (``KeySeen``: the caller replays
    the recorded answer), and the first one's answer is committed, not given back."""
    from sandboxes.models import IdempotentCall
    from sandboxes.services.offers import KeySeen, sandbox_release_direct_many

    job = make_job(warm_per_key=0)
    prewarm(direct_controller, job.pk, 1)
    (claimed,), _ = claim_many_with([claim_record(job.pk)], _healthy)
    sandbox_id = claimed.pod.sandbox_id

    async def one() -> list[Any]:
        async with traced_connection(tmp_path / "release.trace") as conn:
            return await sandbox_release_direct_many(
                conn=conn,
                sandbox_ids=[sandbox_id, sandbox_id],
                now=timezone.now(),
                keys=[("r-1", {"released": 1}), ("r-1", {"released": 2})],
            )

    first, second = async_to_sync(one)()

    assert first is None
    assert isinstance(second, KeySeen) and second.args == ("r-1",)
    call = IdempotentCall.objects.get(route="release", scope=sandbox_id, key="r-1")
    assert call.answer == {"released": 1}


# --- a new connection of the claim pool: planned before a burst meets it -----------------------


def named_relations(trace: str) -> set[str]:
    """The relations the client's statements name, from a libpq protocol trace (the
    ``Parse`` and ``Query`` messages' texts)."""
    import re

    names: set[str] = set()
    for line in trace.splitlines():
        if line.startswith("F") and ("\tParse\t" in line or "\tQuery\t" in line):
            names |= set(re.findall(r'\b(?:FROM|INTO|UPDATE|JOIN)\s+"?([a-z_]+)"?', line))
    return names


def test_a_new_claim_connection_plans_every_relation_a_keyed_claim_and_release_name(
    direct_controller: Controller, tmp_path: Any
) -> None:
    """``warm_connection`` (the claim pool's ``configure``) plans, with ``EXPLAIN`` and
    without an error, a statement on every relation that a keyed claim and a keyed release
    then send statements to, so a new session has read them all into its caches before
    the pool hands it to a claim (a new session's first plan of a statement costs it the
    catalog reads: https://www.postgresql.org/docs/15/sql-explain.html plans without
    running). Nothing is written by it."""

    from sandboxes.models import IdempotentCall
    from sandboxes.services.offers import KeyedClaim, sandbox_release_direct_many, warm_connection

    job = make_job(warm_per_key=0)
    prewarm(direct_controller, job.pk, 1)

    def answer(pod: OfferedPod, wait_ms: float) -> dict[str, Any]:
        return {"sandbox_id": pod.sandbox_id}

    keys = [KeyedClaim(key="k-warm", answer=answer)]
    record = {**claim_record(job.pk), "idempotency_key": "k-warm"}
    (claimed,), _ = claim_many_with([record], _healthy, keys=keys, trace=tmp_path / "claim")
    assert claimed is not None and not isinstance(claimed, Exception)

    async def traced(name: str, call: Callable[[Any], Any]) -> str:
        async with traced_connection(tmp_path / name) as conn:
            await call(conn)
        return (tmp_path / name).read_text()

    async def release(conn: Any) -> None:
        (refused,) = await sandbox_release_direct_many(
            conn=conn,
            sandbox_ids=[claimed.pod.sandbox_id],
            now=timezone.now(),
            keys=[("k-release", {"released": True})],
        )
        assert refused is None

    events_before = SandboxEvent.objects.count()
    release_trace = async_to_sync(traced)("release", release)
    used = named_relations((tmp_path / "claim").read_text()) | named_relations(release_trace)
    written = (SandboxEvent.objects.count(), IdempotentCall.objects.count())
    warm_trace = async_to_sync(traced)("warm", warm_connection)

    assert "ErrorResponse" not in warm_trace
    assert {"sandboxes_sandbox", "sandboxes_idempotentcall"} <= used  # the trace was read
    assert used <= named_relations(warm_trace), used - named_relations(warm_trace)
    assert written[0] > events_before
    assert (SandboxEvent.objects.count(), IdempotentCall.objects.count()) == written
