"""The batch services' raw writes: new rows INSERTed, and one statement's parameter rows sent.

Not ``bulk_create`` itself: on the controller's hot writes its INSERT compiler
(``field_as_sql`` per value, ~20 % of the database executor's CPU in a burst) cost more
than the insert. Values go through each field's ``pre_save`` then ``get_db_prep_save`` (or
its shortcut for the exact types, :func:`preparers`: the same value), so what lands in the
table is what ``bulk_create`` would have written.

Round trips: psycopg 3's ``executemany`` is a pipeline, one round trip to send the rows
and another to sync, however few rows there are (the wait loop's samples dominated a lone
warm hand-out's batch). So new rows go as ONE multi-row ``INSERT ... VALUES (..), (..)``
per chunk (one ``execute``, one round trip), and an ``UPDATE`` with one parameter row is
one ``execute``; ``executemany`` stays for an ``UPDATE`` of many rows elsewhere than on
PostgreSQL (one statement each, two round trips in all). On SQLite (in-process, no round
trips) the two measured the same (``bench/results/cpu_per_create_roundtrips.json``).

Statement texts on PostgreSQL: psycopg parses each text into its placeholders in Python,
and caches that parse only for texts of at most 50 parameters. So there, more than one
row goes as each column ONE array (``INSERT ... SELECT * FROM UNNEST(...)``, ``UPDATE ...
FROM UNNEST(...)``, ``= ANY(%s)``; :func:`array_casts`): one text for any number of rows,
parsed once per process. And there the writes of one service call that nobody reads
back go as ONE execute (:class:`Statements`), one round trip for them all.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, Model

_CHUNK_ROWS = 100  # rows per multi-row INSERT at most (fewer where the backend says so)
_UNNEST_CHUNK_ROWS = 1000  # rows per UNNEST insert (its parameters: one array per column)
# (alias, the fields' ids) -> each field's array cast, or None: the fields are the
# models' own, alive as long as the process.
_ARRAY_CASTS: dict[tuple[str, tuple[int, ...]], tuple[str, ...] | None] = {}


class Statements:
    """Writes whose answers nobody reads, sent together at :meth:`send`.

    PostgreSQL: ONE ``execute`` of the statements joined by ``;`` -- one round trip where
    each was its own. Django's PostgreSQL cursor binds parameters on the client (psycopg's
    ``ClientCursor``), which sends them as one simple query; the server runs them in
    order, in the caller's transaction, and the first that fails raises at :meth:`send`
    (the rest do not run). Elsewhere (SQLite: in process, no round trips) each statement
    runs when it is added, as before. A caller that reads what a statement wrote, or
    needs its ``RETURNING`` rows, executes it itself (after :meth:`send`)."""

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection
        self._defer = connection.vendor == "postgresql"
        self._sql: list[str] = []
        self._params: list[Sequence[Any]] = []

    def add(self, sql: str, params: Sequence[Any]) -> None:
        if not self._defer:
            with self.connection.cursor() as cursor:
                cursor.execute(sql, params)
            return
        self._sql.append(sql)
        self._params.append(params)

    def take(self) -> list[tuple[str, Sequence[Any]]]:
        """The queued statements with their prepared parameters, each apart, and none
        left queued: for a caller that sends them itself (the direct hand-out's claim, on an
        async connection; PostgreSQL only)."""
        assert self._defer, "statements are queued on PostgreSQL only"
        taken = list(zip(self._sql, self._params, strict=True))
        self._sql, self._params = [], []
        return taken

    def add_rows(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """``sql`` once per parameter row: a lone row is one statement like any other
        (one ``execute`` at most); more rows are an ``executemany`` of their own, after
        what is queued."""
        if len(rows) == 1:
            self.add(sql, rows[0])
        elif rows:
            self.send()
            with self.connection.cursor() as cursor:
                cursor.executemany(sql, rows)

    def send(self) -> None:
        if not self._sql:
            return
        sql = ";\n".join(self._sql)
        params = [value for one in self._params for value in one]
        self._sql, self._params = [], []
        with self.connection.cursor() as cursor:
            cursor.execute(sql, params)


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
    prep = preparers(connection, fields)
    params = [[p(f.pre_save(r, True)) for f, p in zip(fields, prep, strict=True)] for r in rows]
    return fields, params


def attribute_values(
    connection: BaseDatabaseWrapper, fields: Sequence[Field[Any, Any]], rows: Sequence[Model]
) -> list[list[Any]]:
    """Each row's current values of ``fields`` (their attributes, no ``pre_save``), prepared
    as an ``UPDATE`` of them would be: the parameters of :func:`update_rows`' columns."""
    prep = list(zip(preparers(connection, fields), [f.attname for f in fields], strict=True))
    return [[p(getattr(row, attname)) for p, attname in prep] for row in rows]


Preparer = Callable[[Any], Any]
# (alias, vendor, field id) -> its preparer; the fields are the models' own, alive as long
# as the process.
_PREPARERS: dict[tuple[str, str, int], Preparer] = {}
_AUTO_FIELDS = ("AutoField", "BigAutoField", "SmallAutoField")
_INTEGER_FIELDS = (
    "IntegerField", "BigIntegerField", "SmallIntegerField", "PositiveIntegerField",
    "PositiveBigIntegerField", "PositiveSmallIntegerField",
)  # fmt: skip


def preparers(connection: BaseDatabaseWrapper, fields: Sequence[Field[Any, Any]]) -> list[Preparer]:
    """Each field's ``get_db_prep_save(value, connection)``, the same value for every
    input, cheaper for the values the controller writes.

    Django's chain for one value (``get_db_prep_save`` -> ``get_db_prep_value`` ->
    ``get_prep_value`` -> ``to_python`` -> the backend's ``adapt_*``) was ~a fifth of the
    database executor's CPU in a burst (~29 values a write). On PostgreSQL, a value of
    exactly the type the field stores (``int`` for an integer field -- not ``bool`` --,
    ``str``, ``bool``, ``float``, an AWARE ``datetime``) and ``None`` go straight to what
    that chain ends in: itself, or the backend's own adapter (``adapt_integerfield_value``,
    psycopg's typed integers; ``adapt_datetimefield_value``). Anything else (a subclass, a
    naive datetime, an expression, a JSON field's value, another backend) goes through
    Django's own ``get_db_prep_save``. ``test_rawinsert_preparers.py`` holds the two equal
    for every concrete field of the models over a bank of values."""
    return [_preparer(connection, f) for f in fields]


def _preparer(connection: BaseDatabaseWrapper, field: Field[Any, Any]) -> Preparer:
    key = (connection.alias, connection.vendor, id(field))
    found = _PREPARERS.get(key)
    if found is None:
        found = _PREPARERS[key] = _build_preparer(connection, field)
    return found


def _build_preparer(connection: BaseDatabaseWrapper, field: Field[Any, Any]) -> Preparer:
    alias = connection.alias

    def django(value: Any) -> Any:
        # The calling thread's connection of the alias, not the one this was built with:
        # preparers are shared by every thread (the database executor's, a request's).
        return field.get_db_prep_save(value, connections[alias])

    if connection.vendor != "postgresql":
        return django
    ops = connection.ops
    if field.is_relation:
        # ForeignKey.get_db_prep_save: None (or an empty string where the target takes
        # none) is None, anything else is the target field's own preparation.
        target = _preparer(connection, field.target_field)  # type: ignore[attr-defined]

        def relation(value: Any) -> Any:
            return None if value is None else target(value) if type(value) is int else django(value)

        return relation
    internal = field.get_internal_type()
    if internal in _AUTO_FIELDS:
        return _exact(int, lambda v: v, django)
    if internal in _INTEGER_FIELDS:
        return _exact(int, lambda v: ops.adapt_integerfield_value(v, internal), django)
    if internal in ("CharField", "TextField"):
        return _exact(str, lambda v: v, django)
    if internal == "BooleanField":
        return _exact(bool, lambda v: v, django)
    if internal == "FloatField":
        return _exact(float, lambda v: v, django)
    if internal == "DateTimeField":

        def moment(value: Any) -> Any:
            if value is None:
                return None
            if type(value) is dt.datetime and value.tzinfo is not None:
                return ops.adapt_datetimefield_value(value)
            return django(value)

        return moment
    return django


def _exact(kind: type, convert: Preparer, django: Preparer) -> Preparer:
    def prepare(value: Any) -> Any:
        if value is None:
            return None
        if type(value) is kind:
            return convert(value)
        return django(value)

    return prepare


def insert_values(
    connection: BaseDatabaseWrapper,
    model: type[Model],
    fields: Sequence[Field[Any, Any]],
    params: Sequence[Sequence[Any]],
    *,
    returning: Sequence[str] | None = None,
    skip_conflicts_on: str | None = None,
    into: Statements | None = None,
) -> list[list[tuple[Any, ...]]]:
    """INSERT prepared value rows (one per row, in ``fields``' order) into ``model``'s
    table: ONE multi-row ``VALUES`` statement per chunk (as many rows as the backend takes
    parameters for: ``ops.bulk_batch_size``, at most 100). With ``returning`` (quoted column
    names) each chunk's ``RETURNING`` rows, one list per chunk, in chunk order; with
    ``skip_conflicts_on`` (a quoted unique column) a row whose value is taken is skipped
    and returns nothing. ``into`` (no ``returning``): the statements are added to it."""
    if not params:
        return []
    if into is not None:
        assert returning is None, "a deferred statement's rows are never read"
    qn = connection.ops.quote_name
    head = f"INSERT INTO {qn(model._meta.db_table)} ({', '.join(qn(f.column) for f in fields)})"
    one = f"({', '.join(['%s'] * len(fields))})"
    tail = f" ON CONFLICT ({skip_conflicts_on}) DO NOTHING" if skip_conflicts_on else ""
    tail += f" RETURNING {', '.join(returning)}" if returning else ""
    casts = array_casts(connection, fields) if len(params) > 1 else None
    if casts is not None:
        per, unnest = _UNNEST_CHUNK_ROWS, f"{head} SELECT * FROM UNNEST({', '.join(casts)}){tail}"
    else:
        per = max(1, min(_CHUNK_ROWS, connection.ops.bulk_batch_size(list(fields), list(params))))
    statements: list[tuple[str, list[Any]]] = []
    for start in range(0, len(params), per):
        chunk = params[start : start + per]
        if casts is not None and len(chunk) > 1:
            statements.append((unnest, [list(column) for column in zip(*chunk, strict=True)]))
        else:
            sql = f"{head} VALUES {', '.join([one] * len(chunk))}{tail}"
            statements.append((sql, [value for row in chunk for value in row]))
    if into is not None:  # no cursor here: a caller may prepare off the connection's thread
        for sql, values in statements:
            into.add(sql, values)
        return []
    out: list[list[tuple[Any, ...]]] = []
    with connection.cursor() as cursor:
        for sql, values in statements:
            cursor.execute(sql, values)
            if returning:
                out.append([tuple(r) for r in cursor.fetchall()])
    return out


def array_casts(
    connection: BaseDatabaseWrapper, fields: Sequence[Field[Any, Any]]
) -> tuple[str, ...] | None:
    """PostgreSQL: one ``(%s)::<type>[]`` placeholder per field, for a statement that takes
    each column as ONE array (``UNNEST``); None where that does not apply (another
    backend, or a field Django's own ``bulk_create`` would not unnest either).

    Why: psycopg parses a statement's text into its placeholders in Python, and caches the
    parse only for a text of at most 50 parameters (``MAX_CACHED_STATEMENT_PARAMS``). A
    multi-row ``VALUES`` of 13 events, or of two sandbox rows, is past that, so it
    was parsed again at every batch: a third of the database executor's samples in a
    600-create burst on PostgreSQL. The ``UNNEST`` text is the same for any number of
    rows, and its parameters are one per column. The rule is Django 5.2's
    (``postgresql/compiler.py``, ``SQLInsertCompiler.assemble_as_sql``): no field with
    its own placeholder (``BinaryField``), only the backend's standard types, and the
    type's parameters dropped (``varchar[]``, not ``varchar(48)[]``, so nothing is
    truncated)."""
    if connection.vendor != "postgresql":
        return None
    key = (connection.alias, tuple(id(f) for f in fields))
    try:
        return _ARRAY_CASTS[key]
    except KeyError:
        casts = _ARRAY_CASTS[key] = _casts(connection, fields)
        return casts


def _casts(
    connection: BaseDatabaseWrapper, fields: Sequence[Field[Any, Any]]
) -> tuple[str, ...] | None:
    out = []
    for field in fields:
        target = field.target_field if field.is_relation else field  # type: ignore[attr-defined]
        if hasattr(field, "get_placeholder"):
            return None
        if target.get_internal_type() not in connection.data_types:
            return None
        db_type = field.db_type(connection)
        if not db_type:
            return None
        out.append(f"(%s)::{db_type.split('(')[0]}[]")
    return tuple(out)


def update_rows(
    connection: BaseDatabaseWrapper,
    model: type[Model],
    fields: Sequence[Field[Any, Any]],
    keys: Sequence[Field[Any, Any]],
    params: Sequence[Sequence[Any]],
    into: Statements | None = None,
) -> None:
    """``UPDATE`` ``model``'s rows: each parameter row is the new values of ``fields``, then
    the values of ``keys`` that select its row (equality on each; prepared values).

    PostgreSQL, more than one row: ONE ``UPDATE ... FROM UNNEST(...)`` (each column one
    array: one round trip, and one statement text for any number of rows, see
    :func:`array_casts`), where ``executemany`` was a statement per row in a pipeline's two
    round trips. Else one ``UPDATE ... WHERE key = %s`` per row (:meth:`Statements.add_rows`).
    A key must select one row per parameter row (the callers' keys hold a pk). ``into``:
    the statement is added to it (sent with the others queued there)."""
    if not params:
        return
    writes = into if into is not None else Statements(connection)
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    casts = array_casts(connection, [*fields, *keys]) if len(params) > 1 else None
    if casts is None:
        assignments = ", ".join(f"{qn(f.column)} = %s" for f in fields)
        where = " AND ".join(f"{qn(k.column)} = %s" for k in keys)
        writes.add_rows(f"UPDATE {table} SET {assignments} WHERE {where}", params)
    else:
        values = [f"v{i}" for i in range(len(fields))]
        matches = [f"k{i}" for i in range(len(keys))]
        assignments = ", ".join(
            f"{qn(f.column)} = v.{n}" for f, n in zip(fields, values, strict=True)
        )
        where = " AND ".join(
            f"{table}.{qn(k.column)} = v.{n}" for k, n in zip(keys, matches, strict=True)
        )
        writes.add(
            f"UPDATE {table} SET {assignments} FROM UNNEST({', '.join(casts)}) "
            f"AS v({', '.join(values + matches)}) WHERE {where}",
            [list(column) for column in zip(*params, strict=True)],
        )
    if into is None:
        writes.send()


def member_of(
    connection: BaseDatabaseWrapper, column: str, values: Sequence[Any]
) -> tuple[str, list[Any]]:
    """``column`` (quoted) is one of ``values`` (non-empty): the SQL condition and its
    parameters. PostgreSQL: ``= ANY(%s)``, one text and one parameter for any count (see
    :func:`array_casts`); else ``IN (%s, ...)``."""
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)", [list(values)]
    return f"{column} IN ({', '.join(['%s'] * len(values))})", list(values)


# ``array_casts``' and ``member_of``'s placeholders, exactly as they write them.
_ARRAY_PLACEHOLDER = re.compile(r"\(%s\)::([a-z][a-z ]*)\[\]")
_ANY_PLACEHOLDER = "= ANY(%s)"
_BINARY_MAX = 4096  # distinct statement texts remembered (a process writes a few dozen)
_binary_texts: dict[str, str] = {}


def binary_arrays(sql: str) -> str:
    """``sql`` with the array parameters that :func:`array_casts` and :func:`member_of`
    wrote (``(%s)::<type>[]``, ``= ANY(%s)``) sent in psycopg's binary format (``%b``);
    nothing else changes. For a connection that binds parameters on the server (the
    direct hand-out's async connections); Django's cursor binds them on the client, which
    has no binary parameters, so the controller's statements keep ``%s``.

    Why: psycopg's text dumper of a list quotes every element in Python (a regular
    expression per string); its binary one packs what the C dumpers of its elements give.
    A statement of seven column arrays took 54 / 142 / 429 µs to convert with 1 / 8 / 32
    rows, and 46 / 77 / 162 µs in binary (``/tmp`` experiment, 2,000 conversions each); in
    a profile of the 64-client bench the text dumper was 41 % of the CPU the web workers
    spent queueing the claims' and releases' statements. Both placeholders always carry a
    list (``ANY`` needs an array; psycopg adapts a list, never a tuple, as one)."""
    out = _binary_texts.get(sql)
    if out is None:
        out = _ARRAY_PLACEHOLDER.sub(r"(%b)::\1[]", sql).replace(_ANY_PLACEHOLDER, "= ANY(%b)")
        if len(_binary_texts) < _BINARY_MAX:
            _binary_texts[sql] = out
    return out


def quoted_column(model: type[Model], name: str) -> str:
    """The quoted column of ``model``'s concrete field ``name``, for raw SQL on the
    default database."""
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.concrete, name
    return connections[DEFAULT_DB_ALIAS].ops.quote_name(field.column)
