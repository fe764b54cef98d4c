"""Hand-outs cut by a restart: given back to the retry that names them, else taken back.

A hand-out commits the sandbox ``in_use`` and names it on the acquire's ``pending`` row in
ONE transaction (``moves.hand_out_move``; a warm hand-out finishes the row ``ok`` in it).
If the service dies before the row is finished, the next controller ends it ``failed``,
``service_restarted`` (``acquisitions_close_unanswered``) and adopts the sandbox in use.
Such a sandbox is *unclaimed*: it was handed to a row that ended ``service_restarted``
and no ``ok`` acquisition names it.

Rules a reader must not break (docs/architecture.md §7):
* A retry of the acquire with the same ``Idempotency-Key`` gets THAT sandbox
  (:func:`acquisition_recover`): a new ``ok`` row names it (the ended row is never
  rewritten) and no create is made.
* A renew of the sandbox by its job's trainer claims it too (the trainer holds it).
* An unclaimed sandbox whose ``service_restarted`` end is older than the grace is taken
  back (:func:`sandboxes_reclaim_unclaimed`): ``deleting`` with the reason
  ``unclaimed_after_restart``, decided under the sandbox's row lock, so a claim and a
  reclaim never both win.
* A sandbox named by an ``ok`` row is never reclaimed here: an answer that left with its
  finish committed is the trainer's (its lifetime reclaim still applies).
* An in-use sandbox that NO row can have answered or can let anyone claim -- none ``ok``,
  none ``pending``, none ended ``service_restarted`` names it -- is held by nobody
  (:func:`sandboxes_unanswered`): a created pod's hand-out that committed after its acquire
  had ended (cancelled, timed out; the hand-out names only a ``pending`` row), whose
  controller stopped before the delete that follows such a hand-out (``creates.py``). The
  next controller's reconcile takes it back at once (``reconcile.py``): no retry or renew
  can name it, so no grace applies.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet

from sandboxes import events
from sandboxes.models import Acquisition, Sandbox
from sandboxes.services.acquisitions import SERVICE_RESTARTED, acquisition_insert
from sandboxes.services.batch_deletes import sandbox_begin_delete
from sandboxes.services.deletes import DeleteOrder
from sandboxes.services.rawinsert import quoted_column
from sandboxes.states import AcquisitionOutcome, SandboxState

UNCLAIMED_AFTER_RESTART = events.UNCLAIMED
UNANSWERED_HAND_OUT = events.UNANSWERED
RECOVERED = "recovered: handed out by acquisition {earlier}, whose answer a restart cut"
CLAIMED_BY_RENEW = "claimed: renewed by its trainer after acquisition {earlier} was cut"


@dataclass(frozen=True)
class Recovered:
    """The sandbox an earlier acquire with the same key was handed, as an acquire answers."""

    acquisition_id: int
    sandbox_id: int
    name: str
    address: str
    token: str
    source: str


def _restarted() -> dict[str, object]:
    return {"outcome": AcquisitionOutcome.FAILED, "detail__startswith": SERVICE_RESTARTED}


def _claim_locked(
    sandbox: Sandbox, earlier: Acquisition, *, now: dt.datetime, detail: str, key: str
) -> Acquisition:
    return acquisition_insert(
        job_id=sandbox.job_id,
        user_id=earlier.user_id,
        role=earlier.role,
        image=earlier.image,
        key_hash=earlier.key_hash,
        outcome=AcquisitionOutcome.OK,
        started_at=now,
        now=now,
        sandbox_id=sandbox.pk,
        source=sandbox.source,
        queue_ms=0.0,
        wait_ms=0.0,
        detail=detail.format(earlier=earlier.pk),
        idempotency_key=key,
    )


def _handed_out_with(*, job_id: int, key: str) -> bool:
    """Whether a finished acquisition of ``job_id`` with this key names a sandbox: the
    filter below as ONE raw ``SELECT ... LIMIT 1`` (every keyed acquire asks it on a web
    worker's request thread; the ORM's compile of the ``exists()`` cost ~4x the read)."""

    sql, params = handed_out_query(job_id=job_id, keys=[key])
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone() is not None


def handed_out_query(*, job_id: int, keys: Sequence[str]) -> tuple[str, list[Any]]:
    """:func:`_handed_out_with`'s read for many keys, not run (a direct claim sends it with
    its lock): the keys, of ``keys``, that a finished acquisition of ``job_id`` with a
    sandbox names."""

    def col(name: str) -> str:
        return quoted_column(Acquisition, name)

    table = connection.ops.quote_name(Acquisition._meta.db_table)
    sql = (
        f"SELECT DISTINCT {col('idempotency_key')} FROM {table} WHERE {col('job')} = %s "
        f"AND {col('idempotency_key')} = ANY(%s) AND {col('sandbox')} IS NOT NULL "
        f"AND {col('outcome')} <> %s"
        # The partial index's own condition, stated: the planner cannot prove it from
        # ``= ANY`` of a parameter, and would not use the index.
        f" AND {col('idempotency_key')} > ''"
    )
    return sql, [job_id, list(keys), AcquisitionOutcome.PENDING.value]


def acquisition_recover(*, job_id: int, key: str, now: dt.datetime) -> Recovered | None:
    """The in-use sandbox handed to the latest acquire of ``job_id`` with this key, or None.

    Called by a keyed acquire that has no recorded answer: if an earlier call with the key
    was handed a sandbox that is still in use, this call answers it (a new ``ok`` row when
    the earlier one ended ``service_restarted``), never a second sandbox."""
    if not key:
        return None
    # A key's first call (every call but a resend) has no such row: one plain raw read, no
    # transaction; only a row found is read again under the sandbox's lock.
    if not _handed_out_with(job_id=job_id, key=key):
        return None
    handed = (
        Acquisition.objects.filter(job_id=job_id, idempotency_key=key, sandbox_id__isnull=False)
        .exclude(outcome=AcquisitionOutcome.PENDING)
        .order_by("-pk")
    )
    with transaction.atomic():
        earlier = handed.first()
        if earlier is None or earlier.sandbox_id is None:
            return None
        sandbox = (
            Sandbox.objects.select_for_update()
            .filter(pk=earlier.sandbox_id, job_id=job_id, state=SandboxState.IN_USE)
            .first()
        )
        if sandbox is None:
            return None
        answered = earlier
        if earlier.outcome != AcquisitionOutcome.OK:
            if not earlier.detail.startswith(SERVICE_RESTARTED):
                return None
            answered = _claim_locked(sandbox, earlier, now=now, detail=RECOVERED, key=key)
        return Recovered(
            acquisition_id=answered.pk,
            sandbox_id=sandbox.pk,
            name=sandbox.name,
            address=sandbox.address,
            token=sandbox.token,
            source=sandbox.source,
        )


def sandbox_claim_unclaimed_locked(sandbox: Sandbox, *, now: dt.datetime) -> int | None:
    """Claim a locked in-use sandbox for its trainer if it is unclaimed (a renew proves the
    trainer holds it): the new ``ok`` row's id, or None when nothing was unclaimed."""
    if sandbox.state != SandboxState.IN_USE:
        return None
    if Acquisition.objects.filter(sandbox_id=sandbox.pk, outcome=AcquisitionOutcome.OK).exists():
        return None
    earlier = (
        Acquisition.objects.filter(sandbox_id=sandbox.pk, **_restarted()).order_by("-pk").first()
    )
    if earlier is None:
        return None
    claimed = _claim_locked(
        sandbox, earlier, now=now, detail=CLAIMED_BY_RENEW, key=earlier.idempotency_key
    )
    return claimed.pk


def _unclaimed(backend: str) -> QuerySet[Sandbox]:
    ok = Acquisition.objects.filter(sandbox_id=OuterRef("pk"), outcome=AcquisitionOutcome.OK)
    cut = Acquisition.objects.filter(sandbox_id=OuterRef("pk"), **_restarted())
    return (
        Sandbox.objects.filter(backend=backend, state=SandboxState.IN_USE)
        .filter(Exists(cut))
        .exclude(Exists(ok))
    )


def sandboxes_unanswered(*, backend: str) -> list[int]:
    """Ids of in-use sandboxes of ``backend`` that no acquisition names as answered
    (``ok``), in flight (``pending``) or cut by a restart: held by nobody (rules above).
    Read by a reconcile, after the earlier controller's ``pending`` rows were ended."""
    named = Acquisition.objects.filter(sandbox_id=OuterRef("pk")).filter(
        Q(outcome__in=[AcquisitionOutcome.OK, AcquisitionOutcome.PENDING]) | Q(**_restarted())
    )
    held = Sandbox.objects.filter(backend=backend, state=SandboxState.IN_USE)
    return sorted(held.exclude(Exists(named)).values_list("pk", flat=True))


def sandboxes_unclaimed(*, backend: str) -> list[int]:
    """Ids of in-use sandboxes handed to an acquire a restart cut and claimed by no one."""
    return sorted(_unclaimed(backend).values_list("pk", flat=True))


def sandboxes_reclaim_unclaimed(
    *, backend: str, now: dt.datetime, grace_s: float
) -> list[tuple[int, int, DeleteOrder | None]]:
    """Take back every unclaimed sandbox whose ``service_restarted`` end is older than
    ``grace_s``: ``(job id, sandbox id, the delete order to send)`` each."""
    cutoff = now - dt.timedelta(seconds=grace_s)
    due = Acquisition.objects.filter(
        sandbox_id=OuterRef("pk"), finished_at__lte=cutoff, **_restarted()
    )
    candidates = list(_unclaimed(backend).filter(Exists(due)).values_list("pk", "job_id")[:500])
    out: list[tuple[int, int, DeleteOrder | None]] = []
    for sandbox_id, job_id in candidates:
        with transaction.atomic():
            locked = Sandbox.objects.select_for_update().filter(pk=sandbox_id).first()
            if locked is None or locked.state != SandboxState.IN_USE:
                continue
            if Acquisition.objects.filter(
                sandbox_id=sandbox_id, outcome=AcquisitionOutcome.OK
            ).exists():
                continue  # claimed meanwhile (a retry or a renew): the trainer's
            order = sandbox_begin_delete(
                sandbox_id=sandbox_id,
                reason=UNCLAIMED_AFTER_RESTART,
                now=now,
                kind=UNCLAIMED_AFTER_RESTART,
            )
            out.append((job_id, sandbox_id, order))
    return out
