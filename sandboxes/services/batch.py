"""Many sandbox writes in one transaction, one query of each kind (the controller's batch).

Under a burst the controller makes five writes per create (the row, ``creating``, the
handle, ``ready``, the hand-out), each once one lock + one save + one events insert. The
controller's ``WriteBatcher`` hands what queued up meanwhile to these services instead:

* :func:`sandbox_request_many` inserts the rows of many creates (one INSERT of rows, one of
  their ``state`` events) -- the row-before-send rule holds per create, since each create
  waits for its row before it asks the pacer;
* :func:`sandbox_moves_apply` locks every row of the batch (ONE ``SELECT ... FOR UPDATE``),
  applies each move by the same rules as a single write (``moves.plan_move``), then saves
  them with ONE ``UPDATE`` statement per set of changed fields and records their events
  with ONE multi-row INSERT (``rawinsert``: one round trip each for a lone row);
* :func:`acquisition_record_many` inserts the finished acquisitions of many acquires.

Invariants a reader must not break: a move that is refused (``InvalidTransition``, or its
row is gone: ``NotFound``) leaves its row untouched and is answered with that error, the
others still commit; moves of one sandbox in one batch apply in submission order; the
dashboards hear of each state change after the commit, as for a single write.
"""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model
from django.utils import timezone

from execd.tokens import derive_token
from sandboxes import events
from sandboxes.models import Acquisition, Job, Sandbox, SandboxEvent
from sandboxes.services._publish import publish_on_commit
from sandboxes.services.acquisitions import (
    acquisition_link_sandboxes,
    acquisitions_write,
    not_finished,
)
from sandboxes.services.moves import SandboxMove, hand_out_move, plan_move
from sandboxes.services.rawinsert import (
    Statements,
    attribute_values,
    insert_values,
    member_of,
    prepared_values,
    preparers,
    update_rows,
)
from sandboxes.services.sandboxes import new_sandbox_name, payload
from sandboxes.states import SandboxState
from sandman_site.errors import InvalidTransition, NotFound, SandmanError

Outcome = Sandbox | SandmanError


def batch_atomic() -> transaction.Atomic:
    """A batch service's transaction: the outermost one when it is called alone; inside
    the batcher's transaction (``controller.batcher.apply_groups``) no savepoint of its own
    -- a SAVEPOINT and its RELEASE per kind per batch, two statements each, for a block
    that raises only when the database does (refusals are answers), and ``apply_groups``
    runs a batch again with a savepoint per kind if one raises."""
    return transaction.atomic(savepoint=False)


@dataclass(frozen=True)
class SandboxRequest:
    """The row of one create about to be sent (``sandbox_request``'s arguments)."""

    job_id: int
    role: str
    image: str
    base_commit: str | None
    cpu_millis: int
    memory_bytes: int
    workspace_bytes: int | None
    key_hash: str
    backend: str
    now: dt.datetime


def sandbox_request_many(*, requests: Sequence[SandboxRequest]) -> list[Outcome]:
    """Insert the ``requested`` rows of many creates; per request its row or ``NotFound``."""
    with batch_atomic():
        jobs = _job_keys({r.job_id for r in requests})
        rows: list[Sandbox] = []
        out: list[Outcome] = []
        for r in requests:
            job = jobs.get(r.job_id)
            if job is None:
                out.append(NotFound(f"job {r.job_id} does not exist"))
                continue
            egress, execd_key = job
            name = new_sandbox_name(r.job_id)
            row = Sandbox(
                job_id=r.job_id,
                name=name,
                nonce=secrets.token_hex(16),
                token=derive_token(execd_key.encode(), name),
                backend=r.backend,
                role=r.role,
                state=SandboxState.REQUESTED,
                image=r.image,
                base_commit=r.base_commit or "",
                cpu_millis=r.cpu_millis,
                memory_bytes=r.memory_bytes,
                workspace_bytes=r.workspace_bytes,
                key_hash=r.key_hash,
                egress=egress,
                requested_at=r.now,
            )
            rows.append(row)
            out.append(row)
        _insert_sandboxes(rows)
        insert_events(
            [
                (row.pk, events.STATE, row.requested_at, {"from": "", "to": SandboxState.REQUESTED})
                for row in rows
            ]
        )
        for row in rows:
            publish_on_commit("sandbox.state", payload(row, previous="", at=row.requested_at))
    return out


@dataclass(frozen=True)
class HandOut:
    """One hand-out (``moves.hand_out_move``) and, for a warm one, its finished acquisition
    (``acquisition_record``'s fields; ``sandbox_id``, ``source`` and ``now`` come from the
    move), written in the hand-out's commit."""

    move: SandboxMove
    acquisition: dict[str, Any] | None = None


def sandbox_hand_out_many(*, items: Sequence[HandOut]) -> list[Outcome]:
    """Many hand-outs in ONE transaction: the rows locked once, the moves applied as
    :func:`sandbox_moves_apply` does, and each handed-out sandbox's acquisition finished
    with it (open rows updated, the others inserted). A refused hand-out (the pod was taken
    meanwhile: ``InvalidTransition``) writes nothing, its acquisition included; a finished
    acquisition with an outcome that is not a finished one refuses its hand-out."""
    with batch_atomic():
        out: list[Outcome | None] = [None] * len(items)
        for index, item in enumerate(items):
            if item.acquisition is not None:
                out[index] = not_finished(item.acquisition["outcome"])
        todo = [i for i, answer in enumerate(out) if answer is None]
        moves = [items[i].move for i in todo]
        writes = Statements(_connection())  # the moves' and acquisitions' writes: one send
        locked = lock_rows_by_pk({m.sandbox_id for m in moves})
        applied = apply_moves_locked(locked, moves, into=writes)
        records: list[dict[str, Any]] = []
        for index, answer in zip(todo, applied, strict=True):
            out[index] = answer
            move, record = items[index].move, items[index].acquisition
            if record is not None and not isinstance(answer, SandmanError):
                source = move.fields.get("source", "")
                records.append({**record, "sandbox_id": move.sandbox_id, "source": source})
                records[-1]["now"] = move.now
        acquisitions_write(records, into=writes)
        writes.send()
    return [answer for answer in out if answer is not None]


def sandbox_hand_out(
    *,
    sandbox_id: int,
    source: str,
    role: str,
    now: dt.datetime,
    healthy_at: dt.datetime | None = None,
    acquisition: dict[str, Any] | None = None,
) -> Sandbox:
    """Ready → in use: the agent has it now; it is never warm again.

    ``healthy_at`` stamps the health check that preceded a warm hand-out, and
    ``acquisition`` (the fields of ``acquisition_record``) writes the finished
    acquisition, both in the same transaction: one commit per warm hand-out. One hand-out
    of :func:`sandbox_hand_out_many` (the controller batches them).
    """
    move = hand_out_move(
        sandbox_id=sandbox_id, source=source, role=role, now=now, healthy_at=healthy_at
    )
    (answer,) = sandbox_hand_out_many(items=[HandOut(move=move, acquisition=acquisition)])
    if isinstance(answer, Exception):
        raise answer
    return answer


def sandbox_moves_apply(*, moves: Sequence[SandboxMove]) -> list[Outcome]:
    """Apply many moves in one transaction; per move its row or the error that refused it."""
    with batch_atomic():
        return apply_moves_locked(lock_rows_by_pk({m.sandbox_id for m in moves}), moves)


_PAYLOAD_FIELDS = ("id", "job_id", "name", "state", "role", "source", "key_hash", "image")


def sandbox_events_record_many(
    *, items: Sequence[tuple[int, str, dt.datetime, dict[str, Any] | None]]
) -> list[None | SandmanError]:
    """``sandbox_record_event`` for many ``(sandbox_id, kind, now, detail)``: ONE read of
    the rows (only the fields ``payload`` publishes), ONE raw INSERT of the events, each
    published on commit; per item None, or ``NotFound`` (no such sandbox: nothing written
    for it)."""
    with batch_atomic():
        ids = {sandbox_id for sandbox_id, _, _, _ in items}
        rows = Sandbox.objects.only(*_PAYLOAD_FIELDS).in_bulk(ids)
        found = [(i, k, at, dict(d or {})) for i, k, at, d in items if i in rows]
        insert_events(found)
        for sandbox_id, kind, at, _ in found:
            publish_on_commit("sandbox.event", payload(rows[sandbox_id], kind=kind, at=at))
    return [None if i in rows else NotFound(f"sandbox {i} does not exist") for i, _, _, _ in items]


def _job_keys(job_ids: Iterable[int]) -> dict[int, tuple[str, str]]:
    """``{job id: (egress, execd_key)}`` of the jobs that exist (one raw query)."""
    ids = sorted(job_ids)
    connection = _connection()
    meta = Job._meta
    qn = connection.ops.quote_name
    columns = ", ".join(qn(_concrete(n, Job).column) for n in ("id", "egress", "execd_key"))
    where, params = member_of(connection, qn(meta.pk.column), ids)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns} FROM {qn(meta.db_table)} WHERE {where}", params)
        return {pk: (egress, key) for pk, egress, key in cursor.fetchall()}


def _insert_sandboxes(rows: Sequence[Sandbox]) -> None:
    """INSERT new rows with ONE multi-row INSERT per chunk, their pks back by name (unique,
    and new: nobody else holds them) from its ``RETURNING`` (where the backend has it; else
    read back). Each value is prepared as ``bulk_create`` would (``pre_save`` for
    ``auto_now``, then ``get_db_prep_save``); not ``bulk_create`` itself: its compile of a
    ~40-column INSERT cost more CPU than the insert (a batch runs once per few creates
    under a burst)."""
    if not rows:
        return
    connection = _connection()
    meta = Sandbox._meta
    qn = connection.ops.quote_name
    fields, params = prepared_values(connection, Sandbox, rows)
    name_col, pk_col = qn(_concrete("name").column), qn(meta.pk.column)
    returns = connection.features.can_return_rows_from_bulk_insert
    returned = insert_values(
        connection, Sandbox, fields, params, returning=[name_col, pk_col] if returns else None
    )
    pks: dict[str, int] = {name: pk for chunk in returned for name, pk in chunk}
    if not returns:
        names = [row.name for row in rows]
        with connection.cursor() as cursor:
            for start in range(0, len(names), 500):
                where, params = member_of(connection, name_col, names[start : start + 500])
                cursor.execute(
                    f"SELECT {name_col}, {pk_col} FROM {qn(meta.db_table)} WHERE {where}", params
                )
                pks.update(cursor.fetchall())
    for row in rows:
        row.pk = pks[row.name]
        row._state.adding = False
        row._state.db = connection.alias


def lock_rows_by_pk(ids: Iterable[int]) -> dict[int, Sandbox]:
    """The rows of ``ids``, locked (``SELECT ... FOR UPDATE`` where the database has it) in
    ONE lock order (by pk: no deadlock between batches), in the caller's open transaction.

    A raw query over the model's own columns, converted by the converters Django's compiler
    would pick (found once per connection, :func:`_row_reader`): compiling the same
    ``select_for_update().filter(pk__in=...)`` -- or even setting up a ``raw()`` -- cost
    more CPU than fetching the rows (a batch runs once per few writes under a burst)."""
    ordered = sorted(ids)
    if not ordered:
        return {}
    connection = _connection()
    reader = _row_reader(connection)
    pk = connection.ops.quote_name(Sandbox._meta.pk.column)
    where, params = member_of(connection, pk, ordered)
    sql = f"{reader.select} WHERE {where} ORDER BY {pk}"
    if connection.features.has_select_for_update:
        sql += " FOR UPDATE"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        fetched = cursor.fetchall()
    out: dict[int, Sandbox] = {}
    for raw in fetched:
        values = list(raw)
        for i, col, converters in reader.converters:
            for convert in converters:
                values[i] = convert(values[i], col, connection)
        row = Sandbox.from_db(connection.alias, reader.attnames, values)
        out[row.pk] = row
    return out


@dataclass(frozen=True)
class _RowReader:
    select: str  # SELECT <every concrete column> FROM <table>
    attnames: list[str]
    converters: list[tuple[int, Any, list[Any]]]  # (column index, Col, its converters)


_ROW_READERS: dict[tuple[str, str], _RowReader] = {}


def _row_reader(connection: BaseDatabaseWrapper) -> _RowReader:
    """How to read a whole Sandbox row on this connection: built once, as the compiler
    does for each query (backend converters, then the field's own)."""
    key = (connection.alias, connection.vendor)
    reader = _ROW_READERS.get(key)
    if reader is None:
        meta = Sandbox._meta
        qn = connection.ops.quote_name
        fields = list(meta.concrete_fields)
        converters = []
        for i, f in enumerate(fields):
            col = f.get_col(meta.db_table)
            found = connection.ops.get_db_converters(col) + col.get_db_converters(connection)
            if found:
                converters.append((i, col, found))
        reader = _RowReader(
            select=f"SELECT {', '.join(qn(f.column) for f in fields)} FROM {qn(meta.db_table)}",
            attnames=[f.attname for f in fields],
            converters=converters,
        )
        _ROW_READERS[key] = reader
    return reader


def apply_moves_locked(
    locked: dict[int, Sandbox],
    moves: Sequence[SandboxMove],
    *,
    into: Statements | None = None,
    messages: list[dict[str, Any]] | None = None,
) -> list[Outcome]:
    """:func:`sandbox_moves_apply` on rows the caller locked in ITS open transaction. Its
    writes (the rows, the acquisitions' links, the events) go as one send
    (``rawinsert.Statements``); with ``into``, they are added there for the caller's.
    The dashboards' state messages are published at Django's commit, or, with
    ``messages``, appended there for a caller that commits on a connection of its own
    (the direct hand-out: ``services/offers.py``)."""
    stamp = timezone.now()
    dirty: dict[int, Sandbox] = {}
    changed: dict[int, set[str]] = {}
    recorded: list[tuple[int, str, dt.datetime, dict[str, Any]]] = []
    told: list[dict[str, Any]] = []
    links: list[tuple[int, int]] = []
    out: list[Outcome] = []
    for move in moves:
        row = locked.get(move.sandbox_id)
        if row is None:
            out.append(NotFound(f"sandbox {move.sandbox_id} does not exist"))
            continue
        try:
            planned = plan_move(row, move)
        except SandmanError as exc:
            out.append(exc)
            continue
        row.updated_at = stamp
        changed.setdefault(row.pk, set()).update(planned.changed)
        dirty[row.pk] = row
        recorded.extend((row.pk, kind, at, detail) for kind, at, detail in planned.events)
        if move.to is not None and move.publish:
            # Taken now: a later move of the same row in this batch changes it again.
            told.append(payload(row, previous=planned.previous, at=move.now))
        if move.acquisition_id is not None:
            links.append((move.acquisition_id, row.pk))
        out.append(row)
    writes = into if into is not None else Statements(_connection())
    _save_many([(row, frozenset(changed[pk])) for pk, row in dirty.items()], writes)
    acquisition_link_sandboxes(links, into=writes)
    insert_events(recorded, into=writes)
    if into is None:
        writes.send()
    if messages is not None:
        messages.extend(told)
        return out
    for message in told:
        publish_on_commit("sandbox.state", message)
    return out


_EVENT_FIELDS = ("sandbox", "kind", "at", "detail")


def _connection() -> BaseDatabaseWrapper:
    """This thread's connection itself: ``django.db.connection`` is a proxy that looks the
    thread's connection up (asgiref locals) at EVERY attribute, and preparing each value of
    a batch through it cost more than the preparing."""
    return connections[DEFAULT_DB_ALIAS]


def insert_events(
    rows: Sequence[tuple[int, str, dt.datetime, dict[str, Any]]], *, into: Statements | None = None
) -> None:
    """Insert ``(sandbox_id, kind, at, detail)`` events with ONE multi-row INSERT
    (``rawinsert.insert_values``).

    Not ``bulk_create``: building a model per event and compiling the INSERT cost more CPU
    than the insert itself. Each value is prepared by its field (``get_db_prep_save``, through
    ``rawinsert.preparers``), as ``bulk_create`` would (a datetime for SQLite, ``detail`` as
    JSON). ``into``: the INSERT is added there (``rawinsert.Statements``)."""
    if not rows:
        return
    fields = [_concrete(name, SandboxEvent) for name in _EVENT_FIELDS]
    connection = _connection()
    prep = preparers(connection, fields)
    params = [[p(value) for p, value in zip(prep, row, strict=True)] for row in rows]
    insert_values(connection, SandboxEvent, fields, params, into=into)


def _concrete(name: str, model: type[Model] = Sandbox) -> Field[Any, Any]:
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.concrete, name
    return field


def _save_many(rows: Sequence[tuple[Sandbox, frozenset[str]]], into: Statements) -> None:
    """Save each row's changed fields: ONE ``UPDATE ... WHERE id = %s`` statement per set of
    fields (moves of one kind change the same fields), ``rawinsert.update_rows``.

    Not ``QuerySet.bulk_update``: its ``CASE WHEN id = ...`` per field and row cost more CPU
    in Django's expression compiler than the writes it saved (profile_after_bulk_update)."""
    groups: dict[frozenset[str], list[Sandbox]] = {}
    for row, fields in rows:
        groups.setdefault(fields, []).append(row)
    meta = Sandbox._meta
    connection = _connection()
    for fields, members in groups.items():
        model_fields = [_concrete(name) for name in sorted(fields)]
        params = [
            values + [row.pk]
            for row, values in zip(
                members, attribute_values(connection, model_fields, members), strict=True
            )
        ]
        update_rows(connection, Sandbox, model_fields, [meta.pk], params, into=into)


def acquisition_record_many(
    *, records: Sequence[dict[str, Any]]
) -> list[Acquisition | InvalidTransition]:
    """Write many finished acquisitions (``acquisition_record``'s keyword arguments each):
    open rows (``acquisition_id``) updated with one statement, the others inserted with one
    INSERT; a record whose outcome is not a finished one is refused alone."""
    with batch_atomic():
        return acquisitions_write(records)
