"""Recorded answers of REST calls sent with an ``Idempotency-Key`` (acquire, release).

Invariants: one row per (route, scope, key) - the first answer recorded wins and a
concurrent second record returns the first; a row never holds a token; pruning removes
only rows older than the given age (the table is bounded in time, keys are not reused).
"""

from __future__ import annotations

import datetime as dt
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
    """The record's plain ``INSERT`` and its prepared parameters, not run: a direct claim
    sends it in its own commit, where a key recorded first by another call is a unique
    violation that undoes the hand-out (``services.offers``)."""
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


def idempotent_call_seen_query(*, route: str, scope: int, key: str) -> tuple[str, list[Any]]:
    """``SELECT 1`` when the key has a recorded answer (not run here)."""
    qn = connection.ops.quote_name
    cols = {name: qn(_concrete(name).column) for name in ("route", "scope", "key")}
    sql = (
        f"SELECT 1 FROM {qn(IdempotentCall._meta.db_table)} WHERE {cols['route']} = %s"
        f" AND {cols['scope']} = %s AND {cols['key']} = %s"
    )
    return sql, [route, scope, key]


def _concrete(name: str) -> Field[Any, Any]:
    field = IdempotentCall._meta.get_field(name)
    assert isinstance(field, Field) and field.concrete, name
    return field


def idempotent_call_prune(*, now: dt.datetime, max_age_s: float = IDEMPOTENCY_TTL_S) -> int:
    """Delete records older than ``max_age_s``; how many."""
    cutoff = now - dt.timedelta(seconds=max_age_s)
    deleted, _ = IdempotentCall.objects.filter(created_at__lt=cutoff).delete()
    return deleted
