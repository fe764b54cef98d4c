"""The direct hand-out's column arrays in psycopg's binary format (``rawinsert.binary_arrays``):
only the array placeholders change, and rows written that way on an async connection read
back exactly as the controller's text path (Django's cursor) writes the same values."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connection

from sandboxes.models import Acquisition, Job, PendingDelete, Sandbox, SandboxEvent
from sandboxes.services import job_create
from sandboxes.services.batch import insert_events, sandbox_request_many
from sandboxes.services.offers import _queue, database_conninfo, pipelined_transaction
from sandboxes.services.rawinsert import (
    Statements,
    binary_arrays,
    insert_values,
    member_of,
    prepared_values,
    update_rows,
)
from sandboxes.tests.batch_support import sandbox_requests

T0 = dt.datetime(2026, 12, 6, 21, 0, 0, 123456, tzinfo=dt.UTC)
# Text a quoting bug would change: array syntax, quotes, backslashes, NUL-free control
# characters, non-ASCII, an empty string, and what looks like NULL.
TRICKY = ['a,b{c}"d\\e', "", "NULL", "ünï 雪 🚀", "line\nnext\ttab", "'single'"]


def test_only_the_array_placeholders_become_binary() -> None:
    fields = [SandboxEvent._meta.get_field(n) for n in ("sandbox", "kind", "at", "detail")]
    writes = Statements(connection)
    insert_values(connection, SandboxEvent, fields, [[1, "a", T0, None]] * 2, into=writes)
    ((unnest, _),) = writes.take()
    assert "(%s)::bigint[]" in unnest and "(%s)::timestamp with time zone[]" in unnest
    binary = binary_arrays(unnest)
    assert binary == unnest.replace("(%s)::", "(%b)::")
    assert "%s" not in binary
    condition, _ = member_of(connection, '"id"', [1, 2])
    mixed = f'UPDATE "t" SET "a" = %s WHERE {condition} AND "b" = %s'
    assert binary_arrays(mixed) == 'UPDATE "t" SET "a" = %s WHERE "id" = ANY(%b) AND "b" = %s'
    # Not written by array_casts or member_of: left as it is.
    notify = "SELECT pg_notify(%s, note) FROM UNNEST(%s::text[]) AS note"
    assert binary_arrays(notify) == notify
    assert binary_arrays(binary) == binary


def _sandboxes(job: Job, n: int) -> list[int]:
    rows = sandbox_request_many(requests=sandbox_requests(job, n, now=T0))
    return [row.pk for row in rows]  # type: ignore[union-attr]


def _statements(job: Job, ids: list[int], tag: str) -> list[tuple[str, Any]]:
    """The same writes the direct hand-out queues (events, acquisitions, pending deletes,
    an UPDATE by pk), of every column type they use, with tricky values; ``tag`` keeps the
    two paths' unique names apart."""
    writes = Statements(connection)
    insert_events(
        [
            (ids[0], "state", T0, {"text": TRICKY, "n": 2**40, "f": 0.1, "none": None}),
            (ids[1], TRICKY[0][:48], T0 + dt.timedelta(microseconds=1), {}),
            (ids[2], "healthy", T0, {"nested": {"list": [1, "2", None, True]}}),
        ],
        into=writes,
    )
    acquisitions = [
        Acquisition(
            job_id=job.pk,
            sandbox_id=sid,
            user_id=None,
            role="rollout",
            image=text[:512],
            key_hash="k" * 16,
            outcome="ok",
            source="warm",
            started_at=T0,
            finished_at=None if i == 1 else T0,
            queue_ms=None,
            create_ms=1e-9 * i,
            wait_ms=float(i) + 0.5,
            detail=text,
            idempotency_key=f"{tag}-{i}",
        )  # fmt: skip
        for i, (sid, text) in enumerate(zip(ids, TRICKY, strict=False))
    ]
    fields, params = prepared_values(connection, Acquisition, acquisitions)
    insert_values(connection, Acquisition, fields, params, into=writes)
    pending = [
        PendingDelete(
            name=f"{tag}-{i}",
            backend="local",
            backend_uid=text[:64],
            backend_ref=text,
            nonce="",
            sandbox_id=sid if i else None,
            reason="released",
            attempts=2**31 - 1 - i,
            last_error=text,
            created_at=T0,
            next_attempt_at=T0 + dt.timedelta(days=i),
        )  # fmt: skip
        for i, (sid, text) in enumerate(zip(ids, TRICKY, strict=False))
    ]
    fields, params = prepared_values(connection, PendingDelete, pending)
    insert_values(connection, PendingDelete, fields, params, into=writes)
    sandbox_fields = [Sandbox._meta.get_field(n) for n in ("address", "node", "offered_at")]
    update_rows(
        connection,
        Sandbox,
        sandbox_fields,  # type: ignore[arg-type]
        [Sandbox._meta.pk],  # type: ignore[list-item]
        [[f"{tag}:{TRICKY[i]}", TRICKY[i], T0 if i else None, sid] for i, sid in enumerate(ids)],
        into=writes,
    )
    return writes.take()


def _read(ids: list[int], tag: str, before: set[int]) -> dict[str, Any]:
    def rows(queryset: Any, *drop: str) -> list[dict[str, Any]]:
        return [{k: v for k, v in row.items() if k not in {"id", *drop}} for row in queryset]

    return {
        "events": rows(
            SandboxEvent.objects.filter(sandbox_id__in=ids)
            .exclude(id__in=before)  # the requests' own events
            .order_by("id")
            .values()
        ),
        "acquisitions": rows(
            Acquisition.objects.filter(idempotency_key__startswith=f"{tag}-")
            .order_by("id")
            .values(),
            "idempotency_key",
        ),
        "pending": rows(
            PendingDelete.objects.filter(name__startswith=f"{tag}-").order_by("id").values(),
            "name",
        ),
        "sandboxes": [
            (row["address"].split(":", 1)[1], row["node"], row["offered_at"])
            for row in Sandbox.objects.filter(id__in=ids).order_by("id").values()
        ],
    }


async def _binary(statements: list[tuple[str, Any]]) -> None:
    async with await psycopg.AsyncConnection.connect(database_conninfo(), autocommit=True) as conn:
        async with pipelined_transaction(conn):
            await _queue(conn, statements)


@pytest.mark.django_db(transaction=True)
def test_rows_written_with_binary_arrays_read_back_as_the_text_path_writes_them() -> None:
    owner = get_user_model().objects.create_user(username="trainer")
    job = job_create(owner=owner, name="run", egress="allow", now=T0)
    text_ids, binary_ids = _sandboxes(job, 3), _sandboxes(job, 3)
    before = set(SandboxEvent.objects.values_list("id", flat=True))

    statements = _statements(job, text_ids, "text")
    assert all("(%b)" not in sql for sql, _ in statements)
    with connection.cursor() as cursor:  # the controller's path: Django's cursor, text
        for sql, params in statements:
            cursor.execute(sql, params)

    statements = _statements(job, binary_ids, "binary")
    assert sum("(%s)::" in sql for sql, _ in statements) == 4  # every write is an UNNEST
    asyncio.run(_binary(statements))

    text, binary = _read(text_ids, "text", before), _read(binary_ids, "binary", before)
    for rows in (text["events"], binary["events"]):
        for row in rows:
            row.pop("sandbox_id")
    for rows in (text["acquisitions"], binary["acquisitions"], text["pending"], binary["pending"]):
        for row in rows:
            row["sandbox_id"] = row["sandbox_id"] is not None
    assert len(binary["events"]) == 3 and len(binary["acquisitions"]) == 3
    assert binary == text
    assert binary["events"][0]["detail"]["text"] == TRICKY
    assert binary["acquisitions"][1]["finished_at"] is None
    assert binary["sandboxes"][0] == (TRICKY[0], TRICKY[0], None)
