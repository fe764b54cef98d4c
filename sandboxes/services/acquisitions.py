"""Acquisition writes: one row per acquire call, opened ``pending`` and finished once.

The row records what the dashboards need (docs/architecture.md §8): the pacer queue wait,
the create time, the total wait the caller saw, the outcome and where the sandbox came
from. Finishing twice is refused (``InvalidTransition``): an outcome is never rewritten.

The controller opens the row (``pending``) before the acquire changes anything (a hand-out
or a create), so an acquire that was in flight when the service died is on record: the
next controller ends every such row ``failed`` with the reason ``service_restarted``
(:func:`acquisitions_close_unanswered`). A finish given the open row's ``acquisition_id``
updates it (only while it is still ``pending``); without one it inserts a finished row.
A hand-out names its sandbox on the still-``pending`` row in its own transaction
(:func:`acquisition_link_sandboxes`), and ending a row never clears that link: what a
restart cut stays known (``recovery.py``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.db.models import Field

from sandboxes.models import Acquisition
from sandboxes.services._publish import publish_on_commit
from sandboxes.services.rawinsert import (
    Statements,
    attribute_values,
    insert_new_rows,
    update_rows,
)
from sandboxes.states import ACQUISITION_TRANSITIONS, AcquisitionOutcome
from sandman_site.errors import InvalidTransition, NotFound

SERVICE_RESTARTED = "service_restarted"
_FINISH_FIELDS = (
    "outcome",
    "finished_at",
    "sandbox",
    "source",
    "queue_ms",
    "create_ms",
    "wait_ms",
    "detail",
)


def acquisition_start(
    *,
    job_id: int,
    role: str,
    image: str,
    key_hash: str,
    now: dt.datetime,
    user_id: int | None = None,
    idempotency_key: str = "",
) -> Acquisition:
    return Acquisition.objects.create(
        job_id=job_id,
        user_id=user_id,
        role=role,
        image=image,
        key_hash=key_hash,
        outcome=AcquisitionOutcome.PENDING,
        started_at=now,
        idempotency_key=idempotency_key,
    )


def acquisition_record(
    *,
    job_id: int,
    role: str,
    image: str,
    key_hash: str,
    outcome: str,
    started_at: dt.datetime,
    now: dt.datetime,
    user_id: int | None = None,
    sandbox_id: int | None = None,
    source: str = "",
    queue_ms: float | None = None,
    create_ms: float | None = None,
    wait_ms: float | None = None,
    detail: str = "",
    acquisition_id: int | None = None,
    idempotency_key: str = "",
) -> Acquisition:
    """Write one finished acquisition: its open row updated, or a single insert."""
    with transaction.atomic():
        return acquisition_insert(
            acquisition_id=acquisition_id,
            idempotency_key=idempotency_key,
            job_id=job_id,
            role=role,
            image=image,
            key_hash=key_hash,
            outcome=outcome,
            started_at=started_at,
            now=now,
            user_id=user_id,
            sandbox_id=sandbox_id,
            source=source,
            queue_ms=queue_ms,
            create_ms=create_ms,
            wait_ms=wait_ms,
            detail=detail,
        )


def acquisition_insert(**fields: Any) -> Acquisition:
    """:func:`acquisition_record` (its keyword arguments) inside the caller's open
    transaction (no savepoint): one record of :func:`acquisitions_write`, its refusal
    raised."""
    (answer,) = acquisitions_write([fields])
    if isinstance(answer, InvalidTransition):
        raise answer
    return answer


def not_finished(outcome: str) -> InvalidTransition | None:
    """The refusal of an outcome that does not finish a ``pending`` row, or None."""
    if outcome in ACQUISITION_TRANSITIONS[AcquisitionOutcome.PENDING]:
        return None
    return InvalidTransition(f"{outcome!r} is not a finished acquisition outcome")


def acquisitions_write(
    records: Sequence[dict[str, Any]], *, into: Statements | None = None
) -> list[Acquisition | InvalidTransition]:
    """Write many finished acquisitions (``acquisition_record``'s keyword arguments each) in
    the caller's open transaction: open rows (``acquisition_id``) updated with one
    statement (added to ``into`` if given: sent with the caller's other writes), the others
    inserted with one INSERT; a record whose outcome is not a finished one is refused alone
    (``not_finished``)."""
    rows: list[Acquisition] = []
    out: list[Acquisition | InvalidTransition] = []
    for r in records:
        refused = not_finished(r["outcome"])
        if refused is not None:
            out.append(refused)
            continue
        row = Acquisition(
            pk=r.get("acquisition_id"),
            job_id=r["job_id"],
            user_id=r.get("user_id"),
            role=r["role"],
            image=r["image"],
            key_hash=r["key_hash"],
            outcome=r["outcome"],
            source=r.get("source", ""),
            sandbox_id=r.get("sandbox_id"),
            started_at=r["started_at"],
            finished_at=r["now"],
            queue_ms=r.get("queue_ms"),
            create_ms=r.get("create_ms"),
            wait_ms=r.get("wait_ms"),
            detail=str(r.get("detail", ""))[:2000],
            idempotency_key=r.get("idempotency_key", ""),
        )
        rows.append(row)
        out.append(row)
    opened = [row for row in rows if row.pk is not None]  # before the INSERT sets pks
    if len(opened) < len(rows):  # one raw INSERT ... RETURNING (the ORM's compile cost more)
        insert_new_rows(Acquisition, [row for row in rows if row.pk is None], with_pks=True)
    acquisition_finish_open(opened, into=into)
    for row in rows:
        acquisition_published(row, _finished_at(row))
    return out


def _finished_at(row: Acquisition) -> dt.datetime:
    assert row.finished_at is not None  # set from the record's ``now``
    return row.finished_at


def acquisition_open_many(*, records: Sequence[dict[str, Any]]) -> list[Acquisition]:
    """Open many ``pending`` rows with one INSERT (``job_id``, ``user_id``, ``role``,
    ``image``, ``key_hash``, ``started_at``, optionally ``idempotency_key``); the rows come
    back with their ids."""
    rows = [
        Acquisition(
            job_id=r["job_id"],
            user_id=r.get("user_id"),
            role=r["role"],
            image=r["image"],
            key_hash=r["key_hash"],
            outcome=AcquisitionOutcome.PENDING,
            started_at=r["started_at"],
            idempotency_key=r.get("idempotency_key", ""),
        )
        for r in records
    ]
    if len(rows) == 1:
        # One INSERT statement: atomic on its own, so no BEGIN and COMMIT around it (two
        # round trips of the three a lone warm acquire's open cost: it runs during the pod's
        # health check, and the hand-out waits for it).
        insert_new_rows(Acquisition, rows, with_pks=True)
        return rows
    with transaction.atomic(savepoint=False):  # a batch service (``batch.batch_atomic``)
        insert_new_rows(Acquisition, rows, with_pks=True)
    return rows


def _concrete(name: str) -> Field[Any, Any]:
    field = Acquisition._meta.get_field(name)
    assert isinstance(field, Field) and field.concrete, name
    return field


def _pending_row() -> list[Field[Any, Any]]:
    """The keys of an update of a still-``pending`` row: its pk, then its outcome."""
    return [Acquisition._meta.pk, _concrete("outcome")]


def acquisition_finish_open(rows: Sequence[Acquisition], *, into: Statements | None = None) -> None:
    """Save each row's finished fields over its open ``pending`` row: ONE ``UPDATE``
    statement (``rawinsert.update_rows``). A row no longer ``pending`` is left as it is (its
    outcome was written by the controller that came after: never rewritten)."""
    if not rows:
        return
    fields = [_concrete(name) for name in _FINISH_FIELDS]
    db = connections[DEFAULT_DB_ALIAS]
    params = [
        values + [row.pk, AcquisitionOutcome.PENDING.value]
        for row, values in zip(rows, attribute_values(db, fields, rows), strict=True)
    ]
    update_rows(db, Acquisition, fields, _pending_row(), params, into=into)


def acquisition_link_sandboxes(
    links: Sequence[tuple[int, int]], *, into: Statements | None = None
) -> None:
    """Name the sandbox of each ``(acquisition id, sandbox id)`` on its still-``pending``
    row: ONE ``UPDATE`` (``rawinsert.update_rows``), in the caller's transaction (the
    hand-out's). A row already ended (by a later controller) is left as it is."""
    if not links:
        return
    pending = AcquisitionOutcome.PENDING.value
    params = [[sid, aid, pending] for aid, sid in links]
    update_rows(
        connections[DEFAULT_DB_ALIAS],
        Acquisition,
        [_concrete("sandbox")],
        _pending_row(),
        params,
        into=into,
    )


def acquisitions_close_unanswered(
    *, started_before: dt.datetime, now: dt.datetime, backend: str = ""
) -> list[int]:
    """End every ``pending`` acquisition opened before ``started_before`` (by a controller
    that is gone) as ``failed`` with the reason ``service_restarted``; their ids."""
    detail = f"{SERVICE_RESTARTED}: the service stopped before this acquire was answered" + (
        f" ({backend} backend)" if backend else ""
    )
    with transaction.atomic():
        open_rows = list(
            Acquisition.objects.select_for_update()
            .filter(outcome=AcquisitionOutcome.PENDING, started_at__lt=started_before)
            .order_by("pk")
        )
        if not open_rows:
            return []
        Acquisition.objects.filter(
            pk__in=[r.pk for r in open_rows], outcome=AcquisitionOutcome.PENDING
        ).update(outcome=AcquisitionOutcome.FAILED, finished_at=now, detail=detail)
        for row in open_rows:
            row.outcome, row.finished_at, row.detail = AcquisitionOutcome.FAILED, now, detail
            acquisition_published(row, now)
    return [r.pk for r in open_rows]


def acquisition_published(acq: Acquisition, now: dt.datetime) -> None:
    """Tell the dashboards of a finished acquisition after the commit."""
    publish_on_commit("acquisition", acquisition_message(acq, now))


def acquisition_message(acq: Acquisition, now: dt.datetime) -> dict[str, Any]:
    """The dashboards' ``acquisition`` message of a finished acquisition."""
    return {
        "acquisition_id": acq.pk,
        "job_id": acq.job_id,
        "sandbox_id": acq.sandbox_id,
        "outcome": acq.outcome,
        "source": acq.source,
        "role": acq.role,
        "key_hash": acq.key_hash,
        "queue_ms": acq.queue_ms,
        "create_ms": acq.create_ms,
        "wait_ms": acq.wait_ms,
        "at": now,
    }


def acquisition_finish(
    *,
    acquisition_id: int,
    outcome: str,
    now: dt.datetime,
    sandbox_id: int | None = None,
    source: str = "",
    queue_ms: float | None = None,
    create_ms: float | None = None,
    wait_ms: float | None = None,
    detail: str = "",
) -> Acquisition:
    with transaction.atomic():
        acq = Acquisition.objects.select_for_update().filter(pk=acquisition_id).first()
        if acq is None:
            raise NotFound(f"acquisition {acquisition_id} does not exist")
        if outcome not in ACQUISITION_TRANSITIONS[acq.outcome]:
            raise InvalidTransition(
                f"acquisition {acquisition_id} is already {acq.outcome}, cannot become {outcome}"
            )
        acq.outcome = outcome
        acq.finished_at = now
        acq.sandbox_id = sandbox_id
        acq.source = source
        acq.queue_ms = queue_ms
        acq.create_ms = create_ms
        acq.wait_ms = wait_ms
        acq.detail = detail[:2000]
        acq.save(update_fields=list(_FINISH_FIELDS))
        acquisition_published(acq, now)
    return acq
