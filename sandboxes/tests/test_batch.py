"""Batched writes (services/batch.py, batch_deletes.py): the single-write rules, one query
of each kind however many sandboxes a batch holds (issue 13, item 3)."""

from __future__ import annotations

import datetime as dt

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test.utils import CaptureQueriesContext

from sandboxes import events
from sandboxes.controller.batcher import apply_groups
from sandboxes.models import Acquisition, Job, PendingDelete, Sandbox, SandboxEvent
from sandboxes.providers.base import ReadyInfo
from sandboxes.services import job_create
from sandboxes.services.batch import (
    HandOut,
    SandboxRequest,
    acquisition_record_many,
    sandbox_events_record_many,
    sandbox_hand_out_many,
    sandbox_moves_apply,
    sandbox_request_many,
)
from sandboxes.services.batch_deletes import (
    DeleteRequest,
    ReleaseRequest,
    pending_delete_confirmed_many,
    sandbox_begin_delete_many,
    sandbox_release_many,
)
from sandboxes.services.moves import (
    creating_move,
    folded,
    hand_out_move,
    handle_move,
    ready_move,
)
from sandboxes.tests.batch_support import sandbox_requests
from sandman_site.errors import AlreadyReleased, InvalidTransition, NotFound, ProviderError

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 10, 18, 8, 0, tzinfo=dt.UTC)


@pytest.fixture
def job() -> Job:
    owner = get_user_model().objects.create_user(username="trainer")
    return job_create(owner=owner, name="run", egress="allow", now=T0)


def _requests(job: Job, n: int) -> list[SandboxRequest]:
    return sandbox_requests(job, n, now=T0)


def _ready(sandbox_id: int) -> object:
    info = ReadyInfo(address="10.0.0.1:8000", node="n1", timeline={"ready": T0}, guards={})
    return ready_move(sandbox_id=sandbox_id, info=info, now=T0)


def _queries(fn: object) -> int:
    with CaptureQueriesContext(connection) as ctx:
        fn()
    return len(ctx.captured_queries)


def _create_path(ids: list[int]) -> None:
    sandbox_moves_apply(moves=[creating_move(sandbox_id=i, now=T0) for i in ids])
    sandbox_moves_apply(
        moves=[
            handle_move(sandbox_id=i, uid=f"u{i}", ref="r", api_created_at=T0, now=T0) for i in ids
        ]
    )
    sandbox_moves_apply(moves=[_ready(i) for i in ids])


def test_a_batch_of_rows_and_moves_costs_the_same_queries_for_2_or_20_sandboxes(job: Job) -> None:
    small = [r.pk for r in sandbox_request_many(requests=_requests(job, 2))]
    large = [r.pk for r in sandbox_request_many(requests=_requests(job, 20))]
    assert _queries(lambda: _create_path(small)) == _queries(lambda: _create_path(large))
    assert _queries(lambda: sandbox_request_many(requests=_requests(job, 2))) == _queries(
        lambda: sandbox_request_many(requests=_requests(job, 20))
    )
    ready = Sandbox.objects.filter(pk__in=large)
    assert {s.state for s in ready} == {"ready"}
    assert all(s.backend_uid == f"u{s.pk}" and s.address == "10.0.0.1:8000" for s in ready)
    kinds = list(
        SandboxEvent.objects.filter(sandbox_id=large[0])
        .order_by("pk")
        .values_list("kind", flat=True)
    )
    assert kinds == [
        events.STATE,  # requested
        events.STATE,  # creating
        events.CREATE_SENT,
        events.API_CREATED,
        events.STATE,  # ready
        events.READY,
    ]


def _statements(fn: object) -> list[tuple[str, int]]:
    """Each statement's text as the driver gets it (placeholders, not values) and its
    number of parameters."""
    sent: list[tuple[str, int]] = []

    def record(execute, sql, params, many, context):  # type: ignore[no-untyped-def]
        sent.append((sql, len(params or ()) if not many else -1))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        fn()  # type: ignore[operator]
    return sent


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="psycopg's statement cache (PostgreSQL only)"
)
def test_a_batch_sends_the_same_statement_texts_for_2_or_20_sandboxes(job: Job) -> None:
    """psycopg parses a statement's text into its placeholders in Python and caches the
    parse only for texts of at most ``MAX_CACHED_STATEMENT_PARAMS`` (50) parameters: a
    multi-row VALUES of a batch's rows was parsed anew every batch (a third of the
    database executor's samples in a 600-create burst). Each column is one array now
    (UNNEST, ``= ANY``), so the texts are the same for any number of rows and short."""
    from psycopg._queries import MAX_CACHED_STATEMENT_PARAMS

    def path(n: int) -> list[tuple[str, int]]:
        made: list[int] = []

        def requests() -> None:
            made.extend(r.pk for r in sandbox_request_many(requests=_requests(job, n)))

        sent = _statements(requests)
        return sent + _statements(lambda: _create_path(made))

    small, large = path(2), path(20)
    assert [sql for sql, _ in small] == [sql for sql, _ in large]
    assert all(0 <= count <= MAX_CACHED_STATEMENT_PARAMS for _, count in large), large
    assert any("UNNEST(" in sql for sql, _ in large)


def test_a_refused_move_raises_alone_and_the_rest_of_its_batch_commits(job: Job) -> None:
    a, b = (r.pk for r in sandbox_request_many(requests=_requests(job, 2)))
    out = sandbox_moves_apply(
        moves=[
            creating_move(sandbox_id=a, now=T0),
            hand_out_move(sandbox_id=b, source="created", role="rollout", now=T0),  # requested!
            creating_move(sandbox_id=10**9, now=T0),
        ]
    )
    assert isinstance(out[0], Sandbox) and out[0].state == "creating"
    assert isinstance(out[1], InvalidTransition)
    assert isinstance(out[2], NotFound)
    assert Sandbox.objects.get(pk=b).state == "requested"
    assert not SandboxEvent.objects.filter(sandbox_id=b, kind=events.ACQUIRED).exists()


def test_moves_of_one_sandbox_in_one_batch_apply_in_order(job: Job) -> None:
    (a,) = (r.pk for r in sandbox_request_many(requests=_requests(job, 1)))
    out = sandbox_moves_apply(moves=[creating_move(sandbox_id=a, now=T0), _ready(a)])
    assert all(isinstance(o, Sandbox) for o in out)
    assert Sandbox.objects.get(pk=a).state == "ready"


def test_batched_deletes_persist_pending_rows_and_end_never_sent_rows_at_once(job: Job) -> None:
    never, sent, twice = (r.pk for r in sandbox_request_many(requests=_requests(job, 3)))
    sandbox_moves_apply(moves=[creating_move(sandbox_id=i, now=T0) for i in (sent, twice)])
    orders = sandbox_begin_delete_many(
        requests=[
            DeleteRequest(sandbox_id=never, reason="drained", now=T0),
            DeleteRequest(sandbox_id=sent, reason="drained", now=T0),
            DeleteRequest(sandbox_id=twice, reason="drained", now=T0),
            DeleteRequest(sandbox_id=twice, reason="again", now=T0),
        ]
    )
    assert orders[0] is None and Sandbox.objects.get(pk=never).state == "deleted"
    assert orders[1] is not None and orders[1].sandbox_id == sent
    assert orders[2] == orders[3] and orders[2] is not None
    assert PendingDelete.objects.count() == 2
    assert Sandbox.objects.get(pk=sent).state == "deleting"
    names = [Sandbox.objects.get(pk=i).name for i in (sent, twice)]
    ended = pending_delete_confirmed_many(names=[*names, names[0], "sm-none"], now=T0)
    assert ended == [sent, twice, None, None]
    assert PendingDelete.objects.count() == 0
    assert set(Sandbox.objects.values_list("state", flat=True)) == {"deleted"}


def test_batched_acquisitions_are_inserted_and_a_pending_outcome_is_refused(job: Job) -> None:
    base = {
        "job_id": job.pk,
        "role": "rollout",
        "image": "sandman/empty",
        "key_hash": "k" * 16,
        "started_at": T0,
        "now": T0,
    }
    out = acquisition_record_many(
        records=[{**base, "outcome": "ok", "wait_ms": 3.0}, {**base, "outcome": "pending"}]
    )
    assert isinstance(out[0], Acquisition) and out[0].pk is not None
    assert isinstance(out[1], InvalidTransition)
    assert Acquisition.objects.count() == 1


def test_a_kind_that_raises_in_a_mixed_batch_rolls_back_alone_and_the_others_commit(
    job: Job,
) -> None:
    """The batcher's one transaction per batch: each kind in a savepoint."""
    a, b = (r.pk for r in sandbox_request_many(requests=_requests(job, 2)))

    def moves(items: list[object]) -> list[object]:
        return list(sandbox_moves_apply(moves=items))  # type: ignore[arg-type]

    def broken(items: list[object]) -> list[object]:
        sandbox_moves_apply(moves=[creating_move(sandbox_id=b, now=T0)])
        raise ProviderError("refused after writing")

    out = apply_groups([(moves, [creating_move(sandbox_id=a, now=T0)]), (broken, ["x", "y"])])
    assert isinstance(out[moves][0], Sandbox) and out[moves][0].state == "creating"
    assert [type(o) for o in out[broken]] == [ProviderError, ProviderError]
    assert Sandbox.objects.get(pk=a).state == "creating"
    assert Sandbox.objects.get(pk=b).state == "requested"  # its savepoint rolled back
    assert not SandboxEvent.objects.filter(sandbox_id=b, kind=events.CREATE_SENT).exists()


def test_the_handle_folded_into_ready_is_one_write_with_the_events_of_two(job: Job) -> None:
    (a,) = (r.pk for r in sandbox_request_many(requests=_requests(job, 1)))
    sandbox_moves_apply(moves=[creating_move(sandbox_id=a, now=T0)])
    handle = handle_move(sandbox_id=a, uid="u-a", ref="ns/a", api_created_at=T0, now=T0)
    with CaptureQueriesContext(connection) as folded_ctx:
        sandbox_moves_apply(moves=[folded(handle, _ready(a))])
    row = Sandbox.objects.get(pk=a)
    assert (row.state, row.backend_uid, row.backend_ref) == ("ready", "u-a", "ns/a")
    assert row.api_created_at == T0 and row.address == "10.0.0.1:8000"
    kinds = list(
        SandboxEvent.objects.filter(sandbox_id=a).order_by("pk").values_list("kind", flat=True)
    )
    assert kinds[-4:] == [events.CREATE_SENT, events.API_CREATED, events.STATE, events.READY]
    (b,) = (r.pk for r in sandbox_request_many(requests=_requests(job, 1)))
    sandbox_moves_apply(moves=[creating_move(sandbox_id=b, now=T0)])
    two = _queries(
        lambda: (
            sandbox_moves_apply(
                moves=[handle_move(sandbox_id=b, uid="u", ref="r", api_created_at=T0, now=T0)]
            ),
            sandbox_moves_apply(moves=[_ready(b)]),
        )
    )
    assert len(folded_ctx.captured_queries) < two
    with pytest.raises(ValueError):
        folded(_ready(a), handle)  # only a move without a state change folds


def test_acquisitions_opened_in_one_raw_insert_get_their_own_ids(job: Job) -> None:
    """``acquisition_open_many`` (raw multi-row INSERT ... RETURNING, services/rawinsert.py):
    each row object gets the id of the row holding ITS values, in more rows than one chunk."""
    from sandboxes.services.acquisitions import acquisition_open_many

    records = [
        {"job_id": job.pk, "role": "rollout", "image": f"img-{i}", "key_hash": f"{i:016d}",
         "started_at": T0 + dt.timedelta(seconds=i), "idempotency_key": f"key-{i}" if i % 3 else ""}
        for i in range(250)
    ]  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        rows = acquisition_open_many(records=records)
    inserts = [q for q in queries.captured_queries if q["sql"].startswith("INSERT")]
    if connection.vendor == "postgresql":
        # One UNNEST statement, each column one array (rawinsert.array_casts).
        assert len(inserts) == 1 and " SELECT * FROM UNNEST(" in inserts[0]["sql"]
    else:
        # 100 rows per statement at most, fewer where the backend takes fewer parameters
        # (SQLite: 999 // columns, as bulk_create chunks).
        fields = [f for f in Acquisition._meta.concrete_fields if not f.primary_key]
        per = min(100, connection.ops.bulk_batch_size(fields, records))
        assert len(inserts) == -(-250 // per) > 1
    assert len({r.pk for r in rows}) == 250 and all(r.pk for r in rows)
    stored = {a.pk: a for a in Acquisition.objects.filter(job=job)}
    for i, row in enumerate(rows):
        got = stored[row.pk]
        want = (f"img-{i}", f"{i:016d}", records[i]["started_at"])
        assert (got.image, got.key_hash, got.started_at) == want
        assert got.outcome == "pending" and got.idempotency_key == records[i]["idempotency_key"]
        assert not row._state.adding


def test_pending_deletes_inserted_raw_hold_what_bulk_create_would(job: Job) -> None:
    """``sandbox_begin_delete_many``'s PendingDelete rows (one raw multi-row INSERT)."""
    made = sandbox_request_many(requests=_requests(job, 3))
    assert all(isinstance(r, Sandbox) for r in made)
    rows = [r for r in made if isinstance(r, Sandbox)]
    sandbox_moves_apply(moves=[creating_move(sandbox_id=r.pk, now=T0) for r in rows])
    orders = sandbox_begin_delete_many(
        requests=[DeleteRequest(sandbox_id=r.pk, reason="x" * 80, now=T0) for r in rows]
    )
    assert [getattr(o, "sandbox_id", None) for o in orders] == [r.pk for r in rows]
    stored = {p.name: p for p in PendingDelete.objects.all()}
    for r in rows:
        p = stored[r.name]
        assert (p.sandbox_id, p.reason, p.attempts, p.created_at, p.next_attempt_at) == (
            r.pk,
            "x" * 64,
            0,
            T0,
            T0,
        )


def test_batched_events_are_one_read_and_one_insert_and_a_missing_sandbox_is_refused(
    job: Job,
) -> None:
    """``sandbox_events_record_many`` (the batcher's ``event``: the WARM event of a create)."""
    from sandboxes.services.batch import sandbox_events_record_many

    a, b = (r.pk for r in sandbox_request_many(requests=_requests(job, 2)))
    before = SandboxEvent.objects.count()
    items = [(a, events.WARM, T0, {"late": False}), (999_999, events.WARM, T0, None),
             (b, events.WARM, T0, None)]  # fmt: skip
    with CaptureQueriesContext(connection) as queries:
        out = sandbox_events_record_many(items=items)
    assert out[0] is None and out[2] is None and isinstance(out[1], NotFound)
    sqls = [q["sql"] for q in queries.captured_queries]
    assert sum(q.startswith("SELECT") for q in sqls) == 1
    assert sum("INSERT INTO" in q for q in sqls) == 1  # one executemany ("2 times: INSERT")
    assert SandboxEvent.objects.count() == before + 2
    warm = SandboxEvent.objects.filter(kind=events.WARM).order_by("sandbox_id")
    assert [(e.sandbox_id, e.detail, e.at) for e in warm] == [(a, {"late": False}, T0), (b, {}, T0)]


def _in_use(job: Job, n: int, role: str = "rollout") -> list[int]:
    ids = [r.pk for r in sandbox_request_many(requests=_requests(job, n))]
    _create_path(ids)
    sandbox_hand_out_many(
        items=[
            HandOut(hand_out_move(sandbox_id=i, source="created", role=role, now=T0)) for i in ids
        ]
    )
    return ids


def _acquisition(job: Job, **extra: object) -> dict[str, object]:
    return {
        "job_id": job.pk,
        "role": "rollout",
        "image": "sandman/empty",
        "key_hash": "k" * 16,
        "started_at": T0,
        "outcome": "ok",
        "queue_ms": 0.0,
        "wait_ms": 1.0,
        **extra,
    }


def test_batched_warm_hand_outs_finish_their_acquisitions_and_a_refused_one_writes_nothing(
    job: Job,
) -> None:
    ready = [r.pk for r in sandbox_request_many(requests=_requests(job, 3))]
    _create_path(ready)
    taken = ready[2]
    sandbox_hand_out_many(
        items=[HandOut(hand_out_move(sandbox_id=taken, source="warm", role="rollout", now=T0))]
    )
    opened = Acquisition.objects.create(
        job=job, role="rollout", image="sandman/empty", key_hash="k" * 16, started_at=T0
    )
    later = T0 + dt.timedelta(seconds=1)

    def warm(sandbox_id: int, **acquisition: object) -> HandOut:
        move = hand_out_move(
            sandbox_id=sandbox_id, source="warm", role="rollout", now=later, healthy_at=later
        )
        return HandOut(move, _acquisition(job, **acquisition))

    out = sandbox_hand_out_many(
        items=[
            warm(ready[0], acquisition_id=opened.pk),  # the acquire's open pending row
            warm(ready[1]),  # no open row: inserted
            warm(taken),  # in use already: refused
        ]
    )
    assert [type(o) for o in out] == [Sandbox, Sandbox, InvalidTransition]
    opened.refresh_from_db()
    assert (opened.outcome, opened.sandbox_id, opened.source) == ("ok", ready[0], "warm")
    assert opened.finished_at == later
    inserted = Acquisition.objects.get(sandbox_id=ready[1])
    assert (inserted.outcome, inserted.source, inserted.finished_at) == ("ok", "warm", later)
    assert not Acquisition.objects.filter(sandbox_id=taken).exists()
    assert Acquisition.objects.count() == 2
    assert Sandbox.objects.get(pk=ready[0]).healthy_at == later
    kinds = set(SandboxEvent.objects.filter(sandbox_id=taken, at=later).values_list("kind"))
    assert kinds == set()


def test_batched_releases_begin_their_deletes_keep_grading_pods_and_refuse_a_second_release(
    job: Job,
) -> None:
    rollout, twice = _in_use(job, 2)
    (grading,) = _in_use(job, 1, role="grading")
    later = T0 + dt.timedelta(seconds=1)
    out = sandbox_release_many(
        requests=[
            ReleaseRequest(sandbox_id=rollout, now=later),
            ReleaseRequest(sandbox_id=grading, now=later, verdict="pass", keep_grading=True),
            ReleaseRequest(sandbox_id=twice, now=later),
            ReleaseRequest(sandbox_id=twice, now=later),  # a resend in the same batch
            ReleaseRequest(sandbox_id=10**9, now=later),
        ]
    )
    row, order, kept = out[0]  # type: ignore[misc]
    assert row.state == "deleting" and order is not None and order.name == row.name and not kept
    row, order, kept = out[1]  # type: ignore[misc]
    assert row.state == "released" and order is None and kept
    assert isinstance(out[2], tuple) and out[2][1] is not None
    assert isinstance(out[3], AlreadyReleased)
    assert isinstance(out[4], NotFound)
    states = dict(
        Sandbox.objects.filter(pk__in=(rollout, grading, twice)).values_list("pk", "state")
    )
    assert states == {rollout: "deleting", grading: "released", twice: "deleting"}
    assert set(PendingDelete.objects.values_list("sandbox_id", flat=True)) == {rollout, twice}
    released = SandboxEvent.objects.get(sandbox_id=grading, kind=events.RELEASED)
    assert released.detail == {"verdict": "pass", "patch_sha256": "", "suite": ""}
    assert SandboxEvent.objects.filter(sandbox_id=twice, kind=events.RELEASED).count() == 1
    # A later batch: the same sandbox again is still the 409's AlreadyReleased.
    (again,) = sandbox_release_many(requests=[ReleaseRequest(sandbox_id=rollout, now=later)])
    assert isinstance(again, AlreadyReleased)


def test_a_batch_of_releases_costs_the_same_queries_for_2_or_20_sandboxes(job: Job) -> None:
    small, large = _in_use(job, 2), _in_use(job, 20)
    later = T0 + dt.timedelta(seconds=1)
    assert _queries(
        lambda: sandbox_release_many(requests=[ReleaseRequest(i, later) for i in small])
    ) == _queries(lambda: sandbox_release_many(requests=[ReleaseRequest(i, later) for i in large]))
    assert PendingDelete.objects.count() == 22


def test_a_mixed_batch_that_nobody_refuses_opens_no_savepoint(job: Job) -> None:
    """Each kind of a batch is one service call; with none raising, the batch is one
    transaction and nothing else: no SAVEPOINT/RELEASE pair per kind (the batcher's own
    or the service's)."""
    a, b = (r.pk for r in sandbox_request_many(requests=_requests(job, 2)))

    def moves(items: list[object]) -> list[object]:
        return list(sandbox_moves_apply(moves=items))  # type: ignore[arg-type]

    def events_(items: list[object]) -> list[object]:
        return list(sandbox_events_record_many(items=items))  # type: ignore[arg-type]

    with CaptureQueriesContext(connection) as ctx:
        out = apply_groups(
            [
                (moves, [creating_move(sandbox_id=a, now=T0)]),
                (events_, [(b, events.WARM, T0, {"late": False})]),
            ]
        )
    assert isinstance(out[moves][0], Sandbox) and out[events_] == [None]
    sql = [q["sql"].upper() for q in ctx.captured_queries]
    # Under the test's own transaction the batch's block is the one savepoint.
    assert sum(s.startswith("SAVEPOINT") for s in sql) == 1, sql
    assert Sandbox.objects.get(pk=a).state == "creating"
    assert SandboxEvent.objects.filter(sandbox_id=b, kind=events.WARM).exists()


def test_without_insert_returning_new_rows_still_get_their_ids_and_pending_rows_are_kept(
    job: Job, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend that cannot return rows from a multi-row INSERT (SQLite before 3.35): new
    sandboxes' pks are read back by name, and a delete begun again keeps its pending row
    (read, then only the other rows inserted)."""
    monkeypatch.setattr(type(connection.features), "can_return_rows_from_bulk_insert", False)
    made = sandbox_request_many(requests=_requests(job, 3))
    for row in made:
        assert Sandbox.objects.get(pk=row.pk).name == row.name
    ids = [row.pk for row in made]
    _create_path(ids)
    (first,) = sandbox_begin_delete_many(
        requests=[DeleteRequest(sandbox_id=ids[0], reason="drained", now=T0)]
    )
    again, other = sandbox_begin_delete_many(
        requests=[
            DeleteRequest(sandbox_id=ids[0], reason="again", now=T0),
            DeleteRequest(sandbox_id=ids[1], reason="drained", now=T0),
        ]
    )
    assert first is not None and again == first
    assert other is not None and other.sandbox_id == ids[1]
    assert PendingDelete.objects.get(name=made[0].name).reason == "drained"
    assert PendingDelete.objects.count() == 2


def test_a_warm_hand_out_of_an_opened_acquisition_writes_in_one_send(job: Job) -> None:
    """The warm path's hand-out (its acquisition opened before): after the row lock, the
    row's UPDATE, its events and the acquisition's finish are ONE execute on PostgreSQL
    (``rawinsert.Statements``: one round trip where they were three), one each elsewhere;
    every write lands either way."""
    from sandboxes.services.acquisitions import acquisition_open_many

    (box,) = (r.pk for r in sandbox_request_many(requests=_requests(job, 1)))
    _create_path([box])
    (opened,) = acquisition_open_many(
        records=[{"job_id": job.pk, "role": "rollout", "image": "sandman/empty",
                  "key_hash": "k" * 16, "started_at": T0}]
    )  # fmt: skip
    move = hand_out_move(sandbox_id=box, source="warm", role="rollout", now=T0, healthy_at=T0)
    item = HandOut(move, _acquisition(job, acquisition_id=opened.pk, wait_ms=2.5))
    with CaptureQueriesContext(connection) as ctx:
        (answer,) = sandbox_hand_out_many(items=[item])
    assert isinstance(answer, Sandbox)
    data = [
        q["sql"] for q in ctx.captured_queries if not q["sql"].startswith(("SAVEPOINT", "RELEASE"))
    ]
    if connection.vendor == "postgresql":
        assert len(data) == 2 and data[0].startswith("SELECT"), data
        assert [part.split(None, 1)[0] for part in data[1].split(";\n")] == [
            "UPDATE", "INSERT", "UPDATE"
        ]  # fmt: skip
    else:
        assert [q.split(None, 1)[0] for q in data] == ["SELECT", "UPDATE", "INSERT", "UPDATE"]
    row = Sandbox.objects.get(pk=box)
    assert (row.state, row.source, row.healthy_at) == ("in_use", "warm", T0)
    acq = Acquisition.objects.get(pk=opened.pk)
    assert (acq.outcome, acq.sandbox_id, acq.wait_ms) == ("ok", box, 2.5)
    kinds = SandboxEvent.objects.filter(
        sandbox_id=box, at=T0, kind__in=[events.HEALTHY, events.ACQUIRED]
    )
    assert kinds.count() == 2


def test_a_failing_statement_of_one_send_raises_and_its_transaction_keeps_nothing(
    job: Job,
) -> None:
    """``Statements``: the first statement that fails raises (at ``send`` on PostgreSQL,
    at ``add`` elsewhere) and the statements before it roll back with the block."""
    from django.db import IntegrityError, transaction

    from sandboxes.services.rawinsert import Statements

    (box,) = (r.pk for r in sandbox_request_many(requests=_requests(job, 1)))
    other = sandbox_request_many(requests=_requests(job, 1))[0]
    table = connection.ops.quote_name(Sandbox._meta.db_table)
    with pytest.raises(IntegrityError):
        with transaction.atomic():
            writes = Statements(connection)
            writes.add(f"UPDATE {table} SET image = %s WHERE id = %s", ["changed", box])
            # The name is unique: taking the other row's fails.
            writes.add(f"UPDATE {table} SET name = %s WHERE id = %s", [other.name, box])
            writes.add(f"UPDATE {table} SET image = %s WHERE id = %s", ["never", other.pk])
            writes.send()
    assert Sandbox.objects.get(pk=box).image == "sandman/empty"
    assert Sandbox.objects.get(pk=other.pk).image == "sandman/empty"
