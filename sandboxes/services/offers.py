"""Offers: warm pods that an acquire may claim straight from the database (PostgreSQL only).

The controller stamps a never-used warm pod's row ``offered_at`` (:func:`sandbox_offer_many`)
and leaves it alone from then on; a web worker's acquire claims the oldest offered row of
its job and key (:func:`sandbox_claim_offered`: the row lock with ``SKIP LOCKED``, the
health check, then the hand-out, its finished acquisition and its events in ONE commit,
with a notification that tells the controller's books), and its release without a
verdict is written the same way (:func:`sandbox_release_direct`). Both run on the caller's
event loop, on an async psycopg connection: their writes are PREPARED by the controller's
own services (``batch.apply_moves_locked`` into ``rawinsert.Statements``) and sent here.
The controller takes an offer back (:func:`sandbox_withdraw_offers`) before it acts on the
pod itself.

Invariants a reader must not break:
* Whoever moves an offered row first owns the pod: a claim moves it ``in_use``, a withdraw
  clears ``offered_at``. Both run under the row lock and test the row again, so they
  never both win (under READ COMMITTED an UPDATE that waited on a claimant's lock re-reads
  the committed row and skips it).
* A claim hands out only a ``ready`` row that is still offered, of an ``active`` job; the
  hand-out is planned by the controller's own rules (``hand_out_move``, ``plan_move``), so
  the row, the events and the dashboards' messages are the controller's own, to the field;
  no ORM call runs (one would raise in an async context), only the preparing of values.
* The notification is sent inside the claim's transaction, so the controller hears of
  exactly the claims that committed, in commit order (``pg_notify``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from psycopg.pq import TransactionStatus

from sandboxes import events
from sandboxes.models import Acquisition, IdempotentCall, Job, PendingDelete, Sandbox, SandboxEvent
from sandboxes.services._publish import publish_now
from sandboxes.services.acquisitions import acquisition_message
from sandboxes.services.batch import apply_moves_locked, insert_events
from sandboxes.services.batch_deletes import ReleaseRequest, pending_row, release_plan
from sandboxes.services.deletes import pending_order
from sandboxes.services.idempotency import (
    idempotent_calls_answer,
    idempotent_calls_drop,
    idempotent_calls_hold,
)
from sandboxes.services.moves import SandboxMove, hand_out_move
from sandboxes.services.rawinsert import (
    Statements,
    array_casts,
    binary_arrays,
    insert_values,
    prepared_values,
    quoted_column,
)
from sandboxes.services.recovery import handed_out_query
from sandboxes.services.sandboxes import payload, release_refusal
from sandboxes.states import AcquisitionOutcome, JobState, SandboxSource, SandboxState
from sandman_site.errors import NotFound, SandmanError

CHANNEL = "sandman_offers"
CLAIM_ATTEMPTS = 3  # offered pods tried per acquire (an unhealthy one is taken out)

_S = Sandbox._meta.db_table
_J = Job._meta.db_table


@dataclass(frozen=True)
class OfferedPod:
    """What a claimant needs of an offered row: the identity to check and answer."""

    sandbox_id: int
    name: str
    nonce: str
    backend: str
    backend_uid: str
    backend_ref: str
    address: str
    token: str


@dataclass(frozen=True)
class Claimed:
    pod: OfferedPod
    wait_ms: float


@dataclass(frozen=True)
class KeyedClaim:
    """A claim for an acquire sent with an ``Idempotency-Key``: the key is taken with the
    lock (a recorded answer, an earlier hand-out, or a call that took it first:
    :class:`KeySeen`), and the call's answer is recorded in the hand-out's own commit
    (``answer``: the recorded answer, never a token, for the pod and its wait)."""

    key: str
    answer: Callable[[OfferedPod, float], dict[str, Any]]


class KeySeen(Exception):  # noqa: N818 - a signal to the caller, not a failure
    """The key has a history (a recorded answer, an earlier hand-out, or a call that
    took it first): nothing was claimed or released; the caller replays or recovers it."""


def sandbox_offer_many(*, sandbox_ids: Sequence[int], now: dt.datetime) -> list[int]:
    """Stamp warm rows offered; the ids stamped (a row no longer ``ready`` is not)."""
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {_S} SET offered_at = %s WHERE id = ANY(%s) AND state = %s"
            " AND NOT agent_used RETURNING id",
            [now, list(sandbox_ids), SandboxState.READY],
        )
        return [row[0] for row in cur.fetchall()]


def sandbox_withdraw_offers(*, sandbox_ids: Sequence[int]) -> tuple[list[int], dict[int, str]]:
    """Take offers back: the ids withdrawn, and the state of each other row (a claimant won
    it, or it is no longer ``ready``); a row that no longer exists is in neither."""
    ids = list(sandbox_ids)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"UPDATE {_S} SET offered_at = NULL WHERE id = ANY(%s) AND state = %s"
            " AND offered_at IS NOT NULL RETURNING id",
            [ids, SandboxState.READY],
        )
        won = [row[0] for row in cur.fetchall()]
        taken = set(won)  # once: a drain or a trim withdraws every offer of a job at once
        others = [i for i in ids if i not in taken]
        if not others:
            return won, {}
        cur.execute(f"SELECT id, state FROM {_S} WHERE id = ANY(%s)", [others])
        return won, dict(cur.fetchall())


def sandbox_clear_offers() -> int:
    """Withdraw every offer (a controller starting: its books are rebuilt from the rows)."""
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {_S} SET offered_at = NULL WHERE offered_at IS NOT NULL")
        return cur.rowcount


def rows_not_in(*, sandbox_ids: Sequence[int], state: str) -> dict[int, str]:
    """Of these sandboxes, those whose rows are no longer in ``state``, with theirs (a
    sandbox a web worker released behind the books: ``in_use`` left)."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT id, state FROM {_S} WHERE id = ANY(%s) AND state <> %s",
            [list(sandbox_ids), state],
        )
        return dict(cur.fetchall())


def offers_gone(*, sandbox_ids: Sequence[int]) -> dict[int, str]:
    """Of these offered pods, those whose rows are no longer offered, with their state
    (the controller's books follow what a lost notification did not tell)."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT id, state FROM {_S} WHERE id = ANY(%s)"
            " AND NOT (state = %s AND offered_at IS NOT NULL)",
            [list(sandbox_ids), SandboxState.READY],
        )
        return dict(cur.fetchall())


async def sandbox_claim_offered(
    *,
    conn: Any,
    record: dict[str, Any],
    healthy: Callable[[OfferedPod], Awaitable[bool]],
    now: Callable[[], dt.datetime],
    clock: Callable[[], float],
    started: float,
    keyed: KeyedClaim | None = None,
) -> Claimed | None:
    """Claim and hand out the oldest offered pod of ``record``'s job and key, or None, on
    ``conn`` (an async psycopg connection of the caller's loop: no thread, no ORM I/O).

    ``record`` holds the acquisition's fields (``job_id``, ``user_id``, ``role``, ``image``,
    ``key_hash``, ``started_at``, ``idempotency_key``). ``healthy`` checks the pod while its
    row is locked; one that fails is taken out of the offers and marked unhealthy, the
    controller is told (it deletes the pod), and the next offered pod is tried.

    Two round trips and the check: ``BEGIN`` with the row lock, then (pipelined) the row,
    its events, the acquisition, the notification and ``COMMIT``. With ``keyed``, the key
    is taken with the lock (``idempotency.idempotent_calls_hold``: a placeholder this
    transaction alone sees) and the key's earlier hand-outs read; its answer replaces the
    placeholder in the commit: still two round trips. A key with a history (a recorded
    answer, an earlier hand-out, a call that took it first) raises :class:`KeySeen`, with
    nothing claimed. The writes are planned by the controller's own rules
    (``moves.plan_move`` through ``batch.apply_moves_locked``, which prepares them without
    running them) and the dashboards hear of them after the commit, as of the
    controller's."""
    claimant = _Claimant(conn, healthy, now, clock)
    (claimed,) = await _claim(claimant, [record], [started], [keyed], None)
    if isinstance(claimed, KeySeen):
        raise claimed
    return claimed


async def sandbox_claim_offered_many(
    *,
    conn: Any,
    records: Sequence[dict[str, Any]],
    starts: Sequence[float],
    healthy: Callable[[OfferedPod], Awaitable[bool]],
    now: Callable[[], dt.datetime],
    clock: Callable[[], float],
    keys: Sequence[KeyedClaim | None] | None = None,
    wanted: Callable[[int], bool] | None = None,
) -> list[Claimed | KeySeen | None]:
    """:func:`sandbox_claim_offered` for many acquires of ONE job and key at once: each
    record's claim, None (nothing offered) or its :class:`KeySeen`, in order, in the same
    two round trips per attempt as one claim (the lock takes as many offered rows as there
    are records, the keys of ``keys`` are taken with it, the checks run side by side, and
    the hand-outs, their events, their acquisitions, their keys' answers and their
    notifications go with one ``COMMIT``). The records that came first get the oldest
    offers. ``wanted(i)``, asked after the checks, drops a record whose caller has left
    (its pod stays offered). A record that found a pod that failed its check tries again,
    as a lone claim does; one that found none gets None."""
    if len({(r["job_id"], r["key_hash"]) for r in records}) > 1:
        raise ValueError("one batch of claims is of one job and key")
    keyed = list(keys) if keys is not None else [None] * len(records)
    claimant = _Claimant(conn, healthy, now, clock)
    return await _claim(claimant, list(records), list(starts), keyed, wanted)


@dataclass(frozen=True)
class _Claimant:
    """What every attempt of a batch of claims works with: the caller's connection, the
    pods' check and the two clocks (the rows' time, the waits' monotonic one)."""

    conn: Any
    healthy: Callable[[OfferedPod], Awaitable[bool]]
    now: Callable[[], dt.datetime]
    clock: Callable[[], float]


async def _claim(
    claimant: _Claimant,
    records: list[dict[str, Any]],
    starts: list[float],
    keyed: list[KeyedClaim | None],
    wanted: Callable[[int], bool] | None,
) -> list[Claimed | KeySeen | None]:
    results: list[Claimed | KeySeen | None] = [None] * len(records)
    pending = list(range(len(records)))  # indices into records, in arrival order
    for _ in range(CLAIM_ATTEMPTS):
        if not pending:
            break
        served, retry = await _claim_once(
            claimant,
            [records[i] for i in pending],
            [starts[i] for i in pending],
            [keyed[i] for i in pending],
            None if wanted is None else _asked(wanted, pending),
        )
        for j, claimed in served.items():
            results[pending[j]] = claimed
        pending = [pending[j] for j in retry]
    return results


def _asked(wanted: Callable[[int], bool], pending: list[int]) -> Callable[[int], bool]:
    """``wanted`` of an attempt's records, by their indices among all the records."""
    return lambda j: wanted(pending[j])


async def _claim_once(
    claimant: _Claimant,
    records: list[dict[str, Any]],
    starts: list[float],
    keyed: list[KeyedClaim | None],
    wanted: Callable[[int], bool] | None,
) -> tuple[dict[int, Claimed | KeySeen], list[int]]:
    """One attempt of :func:`_claim`: the records answered (index -> claim or
    :class:`KeySeen`) and those to try again (as many as the pods that failed their
    checks, in order)."""
    conn, healthy, now, clock = claimant.conn, claimant.healthy, claimant.now, claimant.clock
    job_id = records[0]["job_id"]
    keys = {i: k.key for i, k in enumerate(keyed) if k is not None}
    async with pipelined_transaction(conn):
        held = handed = None
        if keys:
            calls = [(job_id, key) for key in keys.values()]
            held = await conn.execute(
                *idempotent_calls_hold(route="acquire", calls=calls, now=now())
            )
            handed = await conn.execute(*handed_out_query(job_id=job_id, keys=list(keys.values())))
        cur = await conn.execute(
            _CLAIM_LOCK,
            {
                "job": job_id,
                "key": records[0]["key_hash"],
                "ready": SandboxState.READY,
                "active": JobState.ACTIVE,
                "n": len(records),
            },
        )
        found = await cur.fetchall()  # the keys' answers came back with it
        # key -> its placeholder's id, for the keys this transaction took
        taken = {key: pk for pk, _, key in await held.fetchall()} if held is not None else {}
        earlier = {key for (key,) in await handed.fetchall()} if handed is not None else set()
        # A key not taken has a history (or a call that took it first); one with an
        # earlier hand-out is a resend whose answer a restart cut (§7's recovery).
        seen = {i for i, key in keys.items() if key not in taken or key in earlier}
        seen |= _resends(keys)
        rows = [
            Sandbox(**dict(zip(_CLAIM_COLUMNS, one, strict=True)), state=SandboxState.READY)
            for one in found
        ]
        pods = [
            OfferedPod(
                row.pk,
                row.name,
                row.nonce,
                row.backend,
                row.backend_uid,
                row.backend_ref,
                row.address,
                row.token,
            )
            for row in rows
        ]
        checks = await asyncio.gather(*(healthy(pod) for pod in pods))
        failed = [row for row, ok in zip(rows, checks, strict=True) if not ok]
        good = [(row, pod) for row, pod, ok in zip(rows, pods, checks, strict=True) if ok]
        at = now()
        ended = clock()
        takers = [i for i in range(len(records)) if i not in seen and (wanted is None or wanted(i))]
        handed_out = [
            (i, row, pod, (ended - starts[i]) * 1000.0)
            for i, (row, pod) in zip(takers, good, strict=False)
        ]
        writes = [statement for row in failed for statement in _unhealthy_writes(row, at)]
        acquisitions: list[Acquisition] = []
        messages: list[dict[str, Any]] = []
        served = {i: Claimed(pod=pod, wait_ms=wait_ms) for i, _, pod, wait_ms in handed_out}
        answered = [
            (taken[keys[i]], keyed[i].answer(pod, wait_ms), pod.sandbox_id)  # type: ignore[union-attr]
            for i, _, pod, wait_ms in handed_out
            if i in keys
        ]
        if answered:
            writes.append(idempotent_calls_answer(answers=answered))
        answered_keys = {keys[i] for i in served if i in keys}
        unanswered = sorted(
            {taken[key] for key in keys.values() if key in taken and key not in answered_keys}
        )
        if unanswered:  # the placeholders of keys that go the usual way: never committed
            writes.append(idempotent_calls_drop(ids=unanswered))
        if handed_out:
            writes, acquisitions, messages = _claim_writes(
                [(row, records[i], wait_ms) for i, row, _, wait_ms in handed_out], at, writes
            )
        inserted = await _queue(conn, writes)
    if handed_out:
        ids = dict(await inserted.fetchall())  # sandbox id -> acquisition id, with the COMMIT
        for acquisition in acquisitions:
            acquisition.pk = ids[acquisition.sandbox_id]
        for message in messages:
            publish_now("sandbox.state", message)
        for acquisition in acquisitions:
            publish_now("acquisition", acquisition_message(acquisition, at))
    answers: dict[int, Claimed | KeySeen] = dict(served)
    answers.update({i: KeySeen(keys[i]) for i in seen})
    unserved = [i for i in takers if i not in served]
    return answers, unserved[: len(failed)]


def _resends(keys: dict[int, Any]) -> set[int]:
    """The calls of a batch (index -> key) whose key an earlier call of the batch holds:
    resends, answered ``KeySeen`` (a process's ``run_once`` lets only one call of a key
    run, so never from one worker; the first call holds the key, and only it may answer
    or give back its placeholder)."""
    first: dict[Any, int] = {}
    for i in sorted(keys):
        first.setdefault(keys[i], i)
    return {i for i, key in keys.items() if first[key] != i}


# What a claim reads of the row: the pod's identity and what the dashboards' message names.
_CLAIM_COLUMNS = (
    "id", "job_id", "name", "nonce", "backend", "backend_uid", "backend_ref", "address",
    "token", "key_hash", "image", "role", "source",
)  # fmt: skip
# The job's state is read once (an InitPlan), not per offered row; the index
# ``sandbox_offered_order`` gives the rows in this order, so the LIMIT reads as many rows
# as there are claims.
_CLAIM_LOCK = (
    f"SELECT {', '.join(_CLAIM_COLUMNS)} FROM {_S}"
    " WHERE job_id = %(job)s AND key_hash = %(key)s AND state = %(ready)s"
    " AND offered_at IS NOT NULL"
    f" AND (SELECT j.state FROM {_J} j WHERE j.id = %(job)s) = %(active)s"
    " ORDER BY offered_at, id LIMIT %(n)s FOR UPDATE SKIP LOCKED"
)


def _claim_writes(
    claims: Sequence[tuple[Sandbox, dict[str, Any], float]],
    at: dt.datetime,
    before: list[tuple[str, Sequence[Any]]],
) -> tuple[list[tuple[str, Sequence[Any]]], list[Acquisition], list[dict[str, Any]]]:
    """The statements of the claims' hand-outs (``(row, record, wait_ms)`` each), after
    ``before``, with the acquisitions' ``INSERT ... RETURNING sandbox_id, id`` last; the
    acquisitions and the dashboards' state messages. Nothing runs here."""
    db = connections[DEFAULT_DB_ALIAS]
    writes = Statements(db)  # PostgreSQL: queued, prepared, never run here
    moves = []
    for row, record, _ in claims:
        move = hand_out_move(
            sandbox_id=row.pk, source=SandboxSource.WARM, role=record["role"], now=at, healthy_at=at
        )
        changed = {**move.fields, "offered_at": None}
        moves.append(dataclasses.replace(move, fields=changed, publish=False))
    rows = {row.pk: row for row, _, _ in claims}
    for answer in apply_moves_locked(rows, moves, into=writes):
        if isinstance(answer, SandmanError):
            raise answer  # the rows are locked and ready: only a broken invariant gets here
    messages = [payload(row, previous=SandboxState.READY, at=at) for row in rows.values()]
    writes.add(
        "SELECT pg_notify(%s, note) FROM UNNEST(%s::text[]) AS note",
        [CHANNEL, [f"claimed:{row.job_id}:{row.pk}" for row in rows.values()]],
    )
    acquisitions = [
        Acquisition(
            job_id=record["job_id"],
            user_id=record.get("user_id"),
            role=record["role"],
            image=record["image"],
            key_hash=record["key_hash"],
            outcome=AcquisitionOutcome.OK,
            source=SandboxSource.WARM,
            sandbox_id=row.pk,
            started_at=record["started_at"],
            finished_at=at,
            queue_ms=0.0,
            wait_ms=wait_ms,
            idempotency_key=record.get("idempotency_key", ""),
        )
        for row, record, wait_ms in claims
    ]
    fields, params = prepared_values(db, Acquisition, acquisitions)
    qn = db.ops.quote_name
    table = qn(Acquisition._meta.db_table)
    head = f"INSERT INTO {table} ({', '.join(qn(f.column) for f in fields)})"
    tail = f" RETURNING {quoted_column(Acquisition, 'sandbox')}, {qn(Acquisition._meta.pk.column)}"
    casts = array_casts(db, fields) if len(params) > 1 else None
    if casts is None:
        values = ", ".join(f"({', '.join(['%s'] * len(fields))})" for _ in params)
        insert = (f"{head} VALUES {values}{tail}", [v for one in params for v in one])
    else:  # one text for any number of claims (see rawinsert.array_casts)
        columns = [list(column) for column in zip(*params, strict=True)]
        insert = (f"{head} SELECT * FROM UNNEST({', '.join(casts)}){tail}", columns)
    return [*before, *writes.take(), insert], acquisitions, messages


def _unhealthy_writes(row: Sandbox, at: dt.datetime) -> list[tuple[str, Sequence[Any]]]:
    """Out of the offers, its ``health_failed`` event, the controller told."""
    writes = Statements(connections[DEFAULT_DB_ALIAS])
    writes.add(f"UPDATE {_S} SET offered_at = NULL WHERE id = %s", [row.pk])
    insert_events([(row.pk, events.HEALTH_FAILED, at, {})], into=writes)
    writes.add("SELECT pg_notify(%s, %s)", [CHANNEL, f"unhealthy:{row.job_id}:{row.pk}"])
    return writes.take()


@contextlib.asynccontextmanager
async def pipelined_transaction(conn: Any) -> AsyncIterator[None]:
    """One transaction in one pipeline on ``conn`` (an async psycopg connection in
    autocommit mode): ``BEGIN`` goes out with the block's first statement and comes back
    when its rows are fetched (one round trip); the statements queued after that go out
    with ``COMMIT`` and the closing sync (one more). On an error the block's statements
    are rolled back (one more, on that path only).

    Not psycopg's ``conn.transaction()``: inside a pipeline it syncs at both of its ends,
    which costs a claim five round trips instead of two."""
    if not conn.autocommit:
        raise ValueError("pipelined_transaction needs an autocommit connection")
    try:
        async with conn.pipeline():
            await conn.execute("BEGIN")
            yield
            await conn.execute("COMMIT")
    except BaseException:
        if not conn.broken and conn.info.transaction_status != TransactionStatus.IDLE:
            await conn.execute("ROLLBACK")
        raise


async def _queue(conn: Any, statements: list[tuple[str, Sequence[Any]]]) -> Any:
    """Queue ``statements`` on ``conn``'s pipeline (sent with its next sync: the COMMIT at
    the block's end), their column arrays in binary (``rawinsert.binary_arrays``); the
    last one's cursor, whose rows arrive with that sync."""
    cur = None
    for sql, params in statements:
        cur = await conn.execute(binary_arrays(sql), params)
    return cur


async def sandbox_release_direct(
    *,
    conn: Any,
    sandbox_id: int,
    now: dt.datetime,
    key: str | None = None,
    answer: dict[str, Any] | None = None,
) -> None:
    """A release without a verdict, written by the caller on ``conn`` (an async psycopg
    connection of its loop): the row locked, the controller's own refusals
    (``release_refusal``: 404, 409 ``already_released``, ``sandbox_lost``) raised, else its
    own release plan (``batch_deletes.release_plan``: in use -> released -> deleting) with
    the ``PendingDelete`` and a ``released`` notification carrying the delete's order,
    pipelined with the ``COMMIT``: two round trips. The controller sends the delete when it
    hears of it, else its next round resumes the stored pending delete (§7).

    With an ``Idempotency-Key`` (``key``, and the ``answer`` to record), as a keyed claim:
    the key taken with the lock (:class:`KeySeen` when it has a history, or a call took it
    first: nothing written) and the answer recorded in the release's commit; a refusal
    records nothing."""
    keyed: list[tuple[str, dict[str, Any]] | None] = [
        (key, answer or {}) if key is not None else None
    ]
    (refused,) = await _release_direct(conn, [sandbox_id], now, keyed)
    if refused is not None:
        raise refused


async def sandbox_release_direct_many(
    *,
    conn: Any,
    sandbox_ids: Sequence[int],
    now: dt.datetime,
    keys: Sequence[tuple[str, dict[str, Any]] | None] | None = None,
) -> list[SandmanError | KeySeen | None]:
    """:func:`sandbox_release_direct` for many releases at once: each one's refusal, its
    :class:`KeySeen` or None (released), in order, in the same two round trips as one (the
    keys of ``keys`` (``(key, answer)``) taken and the rows locked in id order, every
    release planned and its writes queued, one ``COMMIT``). A refusal leaves only its own
    release out; two releases of one sandbox in a batch are answered as one after the
    other (the second: ``already_released``)."""
    keyed = list(keys) if keys is not None else [None] * len(sandbox_ids)
    return await _release_direct(conn, list(sandbox_ids), now, keyed)


async def _release_direct(
    conn: Any,
    sandbox_ids: list[int],
    now: dt.datetime,
    keyed: list[tuple[str, dict[str, Any]] | None],
) -> list[SandmanError | KeySeen | None]:
    messages: list[dict[str, Any]] = []
    out: list[SandmanError | KeySeen | None] = []
    keys = {i: k[0] for i, k in enumerate(keyed) if k is not None}
    async with pipelined_transaction(conn):
        held = None
        if keys:
            calls = [(sandbox_ids[i], key) for i, key in keys.items()]
            held = await conn.execute(*idempotent_calls_hold(route="release", calls=calls, now=now))
        cur = await conn.execute(binary_arrays(_RELEASE_LOCK), [sorted(set(sandbox_ids))])
        found = await cur.fetchall()  # the keys' answers came back with it
        # (sandbox, key) -> its placeholder's id, for the keys this transaction took
        taken = (
            {(scope, key): pk for pk, scope, key in await held.fetchall()}
            if held is not None
            else {}
        )
        rows = {one[0]: Sandbox(**dict(zip(_RELEASE_COLUMNS, one, strict=True))) for one in found}
        db = connections[DEFAULT_DB_ALIAS]
        writes = Statements(db)  # PostgreSQL: queued, prepared, never run here
        pending: list[PendingDelete] = []
        notes: list[str] = []
        moves: list[SandboxMove] = []
        released: set[int] = set()
        again: list[int] = []  # indices of a second release of a row released here
        resent = _resends({i: (sandbox_ids[i], key) for i, key in keys.items()})
        for i, sandbox_id in enumerate(sandbox_ids):
            if i in keys and ((sandbox_id, keys[i]) not in taken or i in resent):
                # A recorded answer, a call took the key, or an earlier call of this batch.
                out.append(KeySeen(keys[i]))
                continue
            row = rows.get(sandbox_id)
            if row is not None and row.pk in released:
                again.append(len(out))  # answered below, from the row as released here
                out.append(None)
                continue
            refused = (
                NotFound(f"sandbox {sandbox_id} does not exist")
                if row is None
                else release_refusal(row)
            )
            out.append(refused)
            if row is None or refused is not None:
                continue
            planned, delete = release_plan(row, ReleaseRequest(sandbox_id=row.pk, now=now))
            moves.extend(planned)
            released.add(row.pk)
            order = None
            if delete is not None:
                pending.append(pending_row(row, delete))
                order = pending_order(pending[-1])
            tail = "" if order is None else json.dumps(dataclasses.asdict(order))
            notes.append(f"released:{row.job_id}:{row.pk}:{tail}")
        # Every release's moves at once: one UPDATE per set of changed fields and one
        # INSERT of the events for the whole batch (``rawinsert``'s UNNEST statements).
        for moved in apply_moves_locked(rows, moves, into=writes, messages=messages):
            if isinstance(moved, SandmanError):
                raise moved  # in use -> released -> deleting is allowed: a broken invariant
        for i in again:  # as if sent after the first: the row is released now
            out[i] = release_refusal(rows[sandbox_ids[i]])
        if notes:
            if pending:
                fields, params = prepared_values(db, PendingDelete, pending)
                insert_values(
                    db, PendingDelete, fields, params, into=writes,
                    skip_conflicts_on=quoted_column(PendingDelete, "name"),
                )  # fmt: skip
            writes.add(
                "SELECT pg_notify(%s, note) FROM UNNEST(%s::text[]) AS note", [CHANNEL, notes]
            )
        statements = writes.take()
        # A released call's key gets its answer; a refused one's is given back (a refusal
        # records nothing: a resend is refused again from the row).
        answered = [
            (taken[(sandbox_ids[i], key)], keyed[i][1], None)  # type: ignore[index]
            for i, key in keys.items()
            if (sandbox_ids[i], key) in taken and out[i] is None
        ]
        dropped = [
            taken[(sandbox_ids[i], key)]
            for i, key in keys.items()
            if (sandbox_ids[i], key) in taken and out[i] is not None and i not in resent
        ]
        if answered:
            statements.append(idempotent_calls_answer(answers=answered))
        if dropped:
            statements.append(idempotent_calls_drop(ids=dropped))
        await _queue(conn, statements)
    for message in messages:
        publish_now("sandbox.state", message)
    return out


# What a release reads of the row: its refusals, its plan, its delete's order, the message.
_RELEASE_COLUMNS = (
    "id", "job_id", "name", "nonce", "backend", "backend_uid", "backend_ref", "state",
    "role", "source", "key_hash", "image", "failure_reason", "released_at",
)  # fmt: skip
# In id order: two batches of releases never wait on each other's locks in a cycle.
_RELEASE_LOCK = (
    f"SELECT {', '.join(_RELEASE_COLUMNS)} FROM {_S} WHERE id = ANY(%s) ORDER BY id FOR UPDATE"
)


# What a claim and a release touch: each relation's pk lookup is planned on a new
# connection, which reads the relation and all its indexes into that server process's
# caches (``warm_connection``).
_TOUCHED = (Sandbox, Job, SandboxEvent, Acquisition, PendingDelete, IdempotentCall)


async def warm_connection(conn: Any) -> None:
    """Plan, without running, what a claim and a release send (``EXPLAIN``): a new
    PostgreSQL session reads each relation, index, type and function a statement names
    into its process's caches the first time it plans one, ~2-3 ms per statement family on
    this VM against ~0.5 ms after; done as the pool adds the connection (its ``configure``)
    instead of inside a burst's first batches. Nothing is locked or written. A statement
    that cannot be planned (a schema not migrated yet) is left for the claim to meet."""
    import psycopg

    job = {"job": 0, "key": "", "ready": SandboxState.READY, "active": JobState.ACTIVE, "n": 1}
    texts: list[tuple[str, Any]] = [
        (_CLAIM_LOCK, job),
        (_RELEASE_LOCK, [[0]]),
        idempotent_calls_hold(route="acquire", calls=[(0, "")], now=dt.datetime.now(dt.UTC)),
        handed_out_query(job_id=0, keys=[""]),
        *(
            (f"SELECT 1 FROM {model._meta.db_table} WHERE {model._meta.pk.column} = %s", [0])
            for model in _TOUCHED
        ),
    ]
    for text, params in texts:
        try:
            await conn.execute(f"EXPLAIN {text}", params)
        except psycopg.Error:
            return  # autocommit: the connection is as it was


def database_conninfo() -> str:
    """libpq's connection string for the default database (a connection Django does not
    manage: the claims' async pool, the controller's LISTEN)."""
    from psycopg.conninfo import make_conninfo

    db = settings.DATABASES["default"]
    parts = {
        "dbname": db.get("NAME") or "",
        "user": db.get("USER") or "",
        "password": db.get("PASSWORD") or "",
        "host": db.get("HOST") or "",
        "port": str(db.get("PORT") or ""),
    }
    return make_conninfo(**{k: v for k, v in parts.items() if v})
