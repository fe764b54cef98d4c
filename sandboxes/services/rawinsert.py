"""New rows INSERTed with raw SQL, each value prepared as ``bulk_create`` would.

Not ``bulk_create`` itself: on the controller's hot writes its INSERT compiler
(``field_as_sql`` per value, ~20 % of the database executor's CPU in a burst) cost more
than the insert. Values go through each field's ``pre_save`` then ``get_db_prep_save``, so
what lands in the table is what ``bulk_create`` would have written.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model

_CHUNK_ROWS = 100  # rows per multi-row INSERT ... RETURNING (SQLite's variable limit)


def insert_new_rows(model: type[Model], rows: Sequence[Model], *, with_pks: bool = False) -> None:
    """INSERT ``rows`` (all new) of ``model``.

    ``with_pks``: each row gets its pk back (multi-row ``INSERT ... RETURNING``, where the
    backend can; else ``bulk_create``). The returned pks are sorted before they are handed
    out: one statement's auto-increment keys grow in the order of its ``VALUES`` rows
    (SQLite's rowid, PostgreSQL's sequence), while the order of ``RETURNING``'s rows is
    not promised (SQLite's docs say so). Without ``with_pks``: one ``executemany``; the
    rows keep ``pk = None``."""
    if not rows:
        return
    connection = connections[DEFAULT_DB_ALIAS]  # not the proxy: it looks the thread up per use
    meta = model._meta
    qn = connection.ops.quote_name
    fields = [f for f in meta.concrete_fields if not f.primary_key]
    columns = ", ".join(qn(f.column) for f in fields)
    one = f"({', '.join(['%s'] * len(fields))})"
    params = [[f.get_db_prep_save(f.pre_save(r, True), connection) for f in fields] for r in rows]
    if not with_pks:
        with connection.cursor() as cursor:
            cursor.executemany(f"INSERT INTO {qn(meta.db_table)} ({columns}) VALUES {one}", params)
        return
    if not connection.features.can_return_rows_from_bulk_insert:
        model._default_manager.bulk_create(list(rows))
        return
    pk_col = qn(meta.pk.column)
    with connection.cursor() as cursor:
        for start in range(0, len(rows), _CHUNK_ROWS):
            chunk = params[start : start + _CHUNK_ROWS]
            cursor.execute(
                f"INSERT INTO {qn(meta.db_table)} ({columns}) VALUES "
                f"{', '.join([one] * len(chunk))} RETURNING {pk_col}",
                [value for row in chunk for value in row],
            )
            pks = sorted(pk for (pk,) in cursor.fetchall())
            assert len(pks) == len(chunk), (len(pks), len(chunk))
            for row, pk in zip(rows[start : start + _CHUNK_ROWS], pks, strict=True):
                row.pk = pk
                row._state.adding = False
                row._state.db = connection.alias
