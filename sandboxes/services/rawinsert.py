"""The batch services' raw writes: new rows INSERTed, and one statement's parameter rows sent.

Not ``bulk_create`` itself: on the controller's hot writes its INSERT compiler
(``field_as_sql`` per value, ~20 % of the database executor's CPU in a burst) cost more
than the insert. Values go through each field's ``pre_save`` then ``get_db_prep_save``, so
what lands in the table is what ``bulk_create`` would have written.

Round trips: psycopg 3's ``executemany`` is a pipeline, one round trip to send the rows
and another to sync, however few rows there are (the wait loop's samples dominated a lone
warm hand-out's batch). So new rows go as ONE multi-row ``INSERT ... VALUES (..), (..)``
per chunk (one ``execute``, one round trip), and an ``UPDATE`` with one parameter row is
one ``execute``; ``executemany`` stays for an ``UPDATE`` of many rows (one statement each,
two round trips in all). On SQLite (in-process, no round trips) the two measured the
same (``bench/results/cpu_per_create_roundtrips.json``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.utils import CursorWrapper
from django.db.models import Field, Model

_CHUNK_ROWS = 100  # rows per multi-row INSERT at most (fewer where the backend says so)


def insert_new_rows(model: type[Model], rows: Sequence[Model], *, with_pks: bool = False) -> None:
    """INSERT ``rows`` (all new) of ``model``.

    ``with_pks``: each row gets its pk back (multi-row ``INSERT ... RETURNING``, where the
    backend can; else ``bulk_create``). The returned pks are sorted before they are handed
    out: one statement's auto-increment keys grow in the order of its ``VALUES`` rows
    (SQLite's rowid, PostgreSQL's sequence), while the order of ``RETURNING``'s rows is
    not promised (SQLite's docs say so). Without ``with_pks`` the rows keep ``pk = None``."""
    if not rows:
        return
    connection = connections[DEFAULT_DB_ALIAS]  # not the proxy: it looks the thread up per use
    if with_pks and not connection.features.can_return_rows_from_bulk_insert:
        model._default_manager.bulk_create(list(rows))
        return
    fields, params = prepared_values(connection, model, rows)
    pk_col = connection.ops.quote_name(model._meta.pk.column)
    returned = insert_values(
        connection, model, fields, params, returning=[pk_col] if with_pks else None
    )
    if not with_pks:
        return
    start = 0
    for chunk in returned:
        pks = sorted(pk for (pk,) in chunk)
        members = rows[start : start + len(pks)]
        assert len(members) == len(pks), (len(members), len(pks))
        for row, pk in zip(members, pks, strict=True):
            row.pk = pk
            row._state.adding = False
            row._state.db = connection.alias
        start += len(pks)
    assert start == len(rows), (start, len(rows))


def insert_new_rows_skipping(model: type[Model], rows: Sequence[Model], *, unique: str) -> set[Any]:
    """INSERT ``rows`` (all new) of ``model`` but those whose ``unique`` field already has
    a row with their value (``ON CONFLICT (...) DO NOTHING``, PostgreSQL and SQLite 3.24+);
    the values of ``unique`` that were inserted (``RETURNING``). One statement per chunk
    where a read of the rows that exist, then an INSERT of the others, was two (and the
    ORM's compile of the read)."""
    if not rows:
        return set()
    connection = connections[DEFAULT_DB_ALIAS]
    field = model._meta.get_field(unique)
    assert isinstance(field, Field) and field.unique, unique
    if not connection.features.can_return_rows_from_bulk_insert:  # e.g. SQLite < 3.35
        values = [getattr(r, field.attname) for r in rows]
        manager = model._default_manager
        taken = set(manager.filter(**{f"{unique}__in": values}).values_list(unique, flat=True))
        fresh = [r for r in rows if getattr(r, field.attname) not in taken]
        insert_new_rows(model, fresh)
        return {getattr(r, field.attname) for r in fresh}
    column = connection.ops.quote_name(field.column)
    fields, params = prepared_values(connection, model, rows)
    returned = insert_values(
        connection, model, fields, params, returning=[column], skip_conflicts_on=column
    )
    return {value for chunk in returned for (value,) in chunk}


def prepared_values(
    connection: BaseDatabaseWrapper, model: type[Model], rows: Sequence[Model]
) -> tuple[list[Field[Any, Any]], list[list[Any]]]:
    """The non-pk columns and each row's values, prepared as ``bulk_create`` would."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    params = [[f.get_db_prep_save(f.pre_save(r, True), connection) for f in fields] for r in rows]
    return fields, params


def insert_values(
    connection: BaseDatabaseWrapper,
    model: type[Model],
    fields: Sequence[Field[Any, Any]],
    params: Sequence[Sequence[Any]],
    *,
    returning: Sequence[str] | None = None,
    skip_conflicts_on: str | None = None,
) -> list[list[tuple[Any, ...]]]:
    """INSERT prepared value rows (one per row, in ``fields``' order) into ``model``'s
    table: ONE multi-row ``VALUES`` statement per chunk (as many rows as the backend takes
    parameters for: ``ops.bulk_batch_size``, at most 100). With ``returning`` (quoted column
    names) each chunk's ``RETURNING`` rows, one list per chunk, in chunk order; with
    ``skip_conflicts_on`` (a quoted unique column) a row whose value is taken is skipped
    and returns nothing."""
    if not params:
        return []
    qn = connection.ops.quote_name
    head = f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(f.column) for f in fields)})"
    one = f"({', '.join(['%s'] * len(fields))})"
    per = max(1, min(_CHUNK_ROWS, connection.ops.bulk_batch_size(list(fields), list(params))))
    tail = f" ON CONFLICT ({skip_conflicts_on}) DO NOTHING" if skip_conflicts_on else ""
    tail += f" RETURNING {', '.join(returning)}" if returning else ""
    out: list[list[tuple[Any, ...]]] = []
    with connection.cursor() as cursor:
        for start in range(0, len(params), per):
            chunk = params[start : start + per]
            cursor.execute(
                f"{head} VALUES {', '.join([one] * len(chunk))}{tail}",
                [value for row in chunk for value in row],
            )
            if returning:
                out.append([tuple(r) for r in cursor.fetchall()])
    return out


def execute_rows(cursor: CursorWrapper, sql: str, params: Sequence[Sequence[Any]]) -> None:
    """``sql`` once per parameter row: a lone row is one ``execute`` (one round trip), more
    go through ``executemany``."""
    if len(params) == 1:
        cursor.execute(sql, params[0])
    elif params:
        cursor.executemany(sql, params)


def quoted_column(model: type[Model], name: str) -> str:
    """The quoted column of ``model``'s concrete field ``name``, for raw SQL on the
    default database."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.concrete, name
    return connections[DEFAULT_DB_ALIAS].ops.quote_name(field.column)
