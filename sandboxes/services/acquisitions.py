"""Acquisition writes: one row per acquire call, written finished or opened and finished once.

The row records what the dashboards need (docs/architecture.md §8): the pacer queue wait,
the create time, the total wait the caller saw, the outcome and where the sandbox came
from. Finishing twice is refused (``InvalidTransition``): an outcome is never rewritten.
"""

from __future__ import annotations

import datetime as dt

from django.db import transaction

from sandboxes.models import Acquisition
from sandboxes.services._publish import publish_on_commit
from sandboxes.states import ACQUISITION_TRANSITIONS, AcquisitionOutcome
from sandman_site.errors import InvalidTransition, NotFound


def acquisition_start(
    *,
    job_id: int,
    role: str,
    image: str,
    key_hash: str,
    now: dt.datetime,
    user_id: int | None = None,
) -> Acquisition:
    return Acquisition.objects.create(
        job_id=job_id,
        user_id=user_id,
        role=role,
        image=image,
        key_hash=key_hash,
        outcome=AcquisitionOutcome.PENDING,
        started_at=now,
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
) -> Acquisition:
    """Write one finished acquisition in a single insert (the controller's usual path)."""
    with transaction.atomic():
        return acquisition_insert(
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


def acquisition_insert(
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
) -> Acquisition:
    """:func:`acquisition_record` inside the caller's open transaction (no savepoint)."""
    if outcome not in ACQUISITION_TRANSITIONS[AcquisitionOutcome.PENDING]:
        raise InvalidTransition(f"{outcome!r} is not a finished acquisition outcome")
    acq = Acquisition.objects.create(
        job_id=job_id,
        user_id=user_id,
        role=role,
        image=image,
        key_hash=key_hash,
        outcome=outcome,
        source=source,
        sandbox_id=sandbox_id,
        started_at=started_at,
        finished_at=now,
        queue_ms=queue_ms,
        create_ms=create_ms,
        wait_ms=wait_ms,
        detail=detail[:2000],
    )
    acquisition_published(acq, now)
    return acq


def acquisition_published(acq: Acquisition, now: dt.datetime) -> None:
    """Tell the dashboards of a finished acquisition after the commit."""
    publish_on_commit(
        "acquisition",
        {
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
        },
    )


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
        acq.save(
            update_fields=[
                "outcome",
                "finished_at",
                "sandbox",
                "source",
                "queue_ms",
                "create_ms",
                "wait_ms",
                "detail",
            ]
        )
        acquisition_published(acq, now)
    return acq
