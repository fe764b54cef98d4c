"""Bulk writes for ``seed_history``: ``COPY ... FROM STDIN`` on PostgreSQL, ``bulk_create``
elsewhere.

Rows are dicts keyed by field attname (``job_id``, not ``job``); a field missing from a row
takes its model default, so a row carries only what the generator decides. Ids are given
by the caller (the generator numbers rows after :func:`next_id`, so children can name their
parents without a round trip), and :func:`reset_sequence` moves the table's identity past
them afterwards.

Invariant: this bypasses services ON PURPOSE (a month of history is not a sequence of
state transitions to replay); it is for seeding benchmark and demo databases only.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from typing import Any

from django.db import connection, models
from django.db.models import Max

BATCH = 2000


def next_id(model: type[models.Model]) -> int:
    """The first id after every row the table holds."""
    return int(model._default_manager.aggregate(m=Max("pk"))["m"] or 0) + 1


def _defaults(model: type[models.Model]) -> list[tuple[str, str, Any, bool]]:
    out = []
    for field in model._meta.concrete_fields:
        default = field.get_default() if field.has_default() else None
        out.append((field.attname, field.column, default, isinstance(field, models.JSONField)))
    return out


_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})


def _text(value: Any, is_json: bool) -> str:
    """One cell of COPY's text format."""
    if value is None:
        return "\\N"
    if is_json:
        return json.dumps(value).translate(_ESCAPES)
    if value is True or value is False:
        return "t" if value else "f"
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, int | float):
        return repr(value)
    return str(value).translate(_ESCAPES)


def bulk_write(model: type[models.Model], rows: Iterable[dict[str, Any]]) -> int:
    """Write ``rows`` into ``model``'s table; returns how many."""
    fields = _defaults(model)
    if connection.vendor != "postgresql":
        return _bulk_create(model, rows)
    table = connection.ops.quote_name(model._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(column) for _, column, _, _ in fields)
    # A missing value is the field's default: its text is computed once, not per row.
    plan = [(name, _text(default, is_json), is_json) for name, _, default, is_json in fields]
    count = 0
    with connection.cursor() as cursor:
        raw = cursor.cursor  # psycopg's own cursor: Django's wrapper has no copy()
        with raw.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            lines: list[str] = []
            for row in rows:
                lines.append(
                    "\t".join(
                        _text(row[name], is_json) if name in row else default
                        for name, default, is_json in plan
                    )
                )
                count += 1
                if len(lines) >= BATCH:
                    copy.write("\n".join(lines) + "\n")
                    lines = []
            if lines:
                copy.write("\n".join(lines) + "\n")
    return count


def _bulk_create(model: type[models.Model], rows: Iterable[dict[str, Any]]) -> int:
    batch: list[models.Model] = []
    count = 0
    for row in rows:
        batch.append(model(**row))
        if len(batch) >= BATCH:
            model._default_manager.bulk_create(batch)
            count += len(batch)
            batch = []
    if batch:
        model._default_manager.bulk_create(batch)
        count += len(batch)
    return count


def reset_sequence(model: type[models.Model]) -> None:
    """Move the table's id sequence past the ids written explicitly (PostgreSQL)."""
    if connection.vendor != "postgresql":
        return  # SQLite's rowid allocation reads max(rowid)
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT setval(pg_get_serial_sequence(%s, 'id'), "
            f"(SELECT COALESCE(MAX(id), 1) FROM {connection.ops.quote_name(table)}))",
            [table],
        )
