"""Recorded answers of REST calls sent with an ``Idempotency-Key`` (acquire, release).

Invariants: one row per (route, scope, key) - the first answer recorded wins and a
concurrent second record returns the first; a row never holds a token; pruning removes
only rows older than the given age (the table is bounded in time, keys are not reused).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Field

from sandboxes.models import IdempotentCall

IDEMPOTENCY_TTL_S = 24 * 3600.0


def idempotent_call_record(
    *,
    route: str,
    scope: int,
    key: str,
    answer: dict[str, Any],
    sandbox_id: int | None,
    now: dt.datetime,
) -> dict[str, Any]:
    """Record ``answer`` for the key, or return the one already recorded.

    ONE statement, ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` (PostgreSQL and SQLite
    3.35+): every keyed acquire and release records its answer, and a transaction around
    an ORM create cost three round trips and the ORM's insert compiler on a request thread."""
    meta = IdempotentCall._meta
    qn = connection.ops.quote_name
    insert, params = idempotent_call_insert(
        route=route, scope=scope, key=key, answer=answer, sandbox_id=sandbox_id, now=now
    )
    unique = ", ".join(qn(_concrete(name).column) for name in ("route", "scope", "key"))
    sql = f"{insert} ON CONFLICT ({unique}) DO NOTHING RETURNING {qn(meta.pk.column)}"
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        inserted = cursor.fetchone()
    if inserted is not None:
        return answer
    first = IdempotentCall.objects.get(route=route, scope=scope, key=key)
    return dict(first.answer)


def idempotent_call_insert(
    *,
    route: str,
    scope: int,
    key: str,
    answer: dict[str, Any],
    sandbox_id: int | None,
    now: dt.datetime,
) -> tuple[str, list[Any]]:
    """The record's plain ``INSERT`` and its prepared parameters, not run
    (:func:`idempotent_call_record` adds its ``ON CONFLICT``)."""
    meta = IdempotentCall._meta
    qn = connection.ops.quote_name
    values = {
        "route": route,
        "scope": scope,
        "key": key,
        "sandbox_id": sandbox_id,
        "answer": answer,
        "created_at": now,
    }
    fields = [_concrete(name) for name in values]
    columns = ", ".join(qn(f.column) for f in fields)
    marks = ", ".join(["%s"] * len(fields))
    params = [f.get_db_prep_save(values[f.name], connection) for f in fields]
    return f"INSERT INTO {qn(meta.db_table)} ({columns}) VALUES ({marks})", params


def idempotent_calls_hold(
    *, route: str, calls: Sequence[tuple[int, str]], now: dt.datetime
) -> tuple[str, list[Any]]:
    """Take keys for calls under way, not run here: ONE ``INSERT`` of a placeholder row
    (empty answer, no sandbox) per ``(scope, key)``, ``ON CONFLICT DO NOTHING RETURNING
    id, scope, key``: the keys returned are this transaction's; a key not returned has a
    history (a recorded answer) or was taken by a call that committed first.

    A direct claim or release sends it with its lock, in ITS transaction, so the
    placeholder is never seen: the call's answer replaces it (:func:`idempotent_calls_answer`)
    or it is dropped (:func:`idempotent_calls_drop`) before the commit, and a concurrent
    call with the same key waits for that commit and then finds the answer (or takes the
    key). The keys go in sorted order: two transactions taking the same keys never wait on
    each other in a cycle."""
    meta = IdempotentCall._meta
    qn = connection.ops.quote_name
    cols = {name: qn(_concrete(name).column) for name in _COLUMNS}
    unique = ", ".join(cols[name] for name in ("route", "scope", "key"))
    ordered = sorted(set(calls))
    sql = (
        f"INSERT INTO {qn(meta.db_table)} ({', '.join(cols.values())})"
        " SELECT %s, v.scope, v.key, NULL, '{}'::jsonb, %s"
        " FROM UNNEST(%s::bigint[], %s::varchar[]) AS v(scope, key) ORDER BY v.scope, v.key"
        f" ON CONFLICT ({unique}) DO NOTHING"
        f" RETURNING {qn(meta.pk.column)}, {cols['scope']}, {cols['key']}"
    )
    created = _concrete("created_at").get_db_prep_save(now, connection)
    return sql, [route, created, [s for s, _ in ordered], [k for _, k in ordered]]


def idempotent_calls_answer(
    *, answers: Sequence[tuple[int, dict[str, Any], int | None]]
) -> tuple[str, list[Any]]:
    """Record ``(id, answer, sandbox_id)`` in the placeholders this transaction holds (their
    ids from :func:`idempotent_calls_hold`): ONE ``UPDATE``, not run here. The rows are
    found by ``id = ANY(...)``, an index condition whatever the planner thinks of the
    table's size (a join with the ``UNNEST`` alone scanned every row of the route)."""
    meta = IdempotentCall._meta
    qn = connection.ops.quote_name
    table, pk = qn(meta.db_table), qn(meta.pk.column)
    cols = {name: qn(_concrete(name).column) for name in _COLUMNS}
    answer = _concrete("answer")
    ids = [row_id for row_id, _, _ in answers]
    sql = (
        f"UPDATE {table} SET {cols['answer']} = v.answer, {cols['sandbox_id']} = v.sandbox"
        " FROM UNNEST(%s::bigint[], %s::jsonb[], %s::bigint[]) AS v(id, answer, sandbox)"
        f" WHERE {table}.{pk} = ANY(%s) AND {table}.{pk} = v.id"
    )
    return sql, [
        ids,
        [answer.get_db_prep_save(body, connection) for _, body, _ in answers],
        [sandbox for _, _, sandbox in answers],
        ids,
    ]


def idempotent_calls_drop(*, ids: Sequence[int]) -> tuple[str, list[Any]]:
    """Give back placeholders this transaction holds and did not answer (the call goes the
    usual way: the controller's, then its own record): ONE ``DELETE``, not run here."""
    meta = IdempotentCall._meta
    qn = connection.ops.quote_name
    return f"DELETE FROM {qn(meta.db_table)} WHERE {qn(meta.pk.column)} = ANY(%s)", [list(ids)]


_COLUMNS = ("route", "scope", "key", "sandbox_id", "answer", "created_at")


def _concrete(name: str) -> Field[Any, Any]:
    field = IdempotentCall._meta.get_field(name)
    assert isinstance(field, Field) and field.concrete, name
    return field


def idempotent_call_prune(*, now: dt.datetime, max_age_s: float = IDEMPOTENCY_TTL_S) -> int:
    """Delete records older than ``max_age_s``; how many."""
    cutoff = now - dt.timedelta(seconds=max_age_s)
    deleted, _ = IdempotentCall.objects.filter(created_at__lt=cutoff).delete()
    return deleted
