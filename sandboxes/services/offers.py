"""Offers: warm pods that an acquire may claim straight from the database (PostgreSQL only).

The controller stamps a never-used warm pod's row ``offered_at`` (:func:`sandbox_offer_many`)
and leaves it alone from then on; a web worker's acquire claims the oldest offered row of
its job and key (:func:`sandbox_claim_offered`: the row lock with ``SKIP LOCKED``, the
health check, then the hand-out, its finished acquisition and its events in ONE commit,
with a notification that tells the controller's books). The controller takes an offer back
(:func:`sandbox_withdraw_offers`) before it acts on the pod itself.

Invariants a reader must not break:
* Whoever moves an offered row first owns the pod: a claim moves it ``in_use``, a withdraw
  clears ``offered_at``. Both run under the row lock and test the row again, so they
  never both win (under READ COMMITTED an UPDATE that waited on a claimant's lock re-reads
  the committed row and skips it).
* A claim hands out only a ``ready`` row that is still offered, of an ``active`` job; the
  hand-out is written by the same service the controller uses
  (``batch.sandbox_hand_out_locked``, the core of its ``sandbox_hand_out_many``), so the
  row, the events, the acquisition and the dashboards' messages are the controller's own,
  to the field.
* The notification is sent inside the claim's transaction, so the controller hears of
  exactly the claims that committed, in commit order (``pg_notify``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction

from sandboxes.models import Job, Sandbox
from sandboxes.services.batch import HandOut, read_rows, sandbox_hand_out_locked
from sandboxes.services.batch_deletes import ReleaseRequest, sandbox_release_many
from sandboxes.services.moves import hand_out_move
from sandboxes.services.rawinsert import Statements
from sandboxes.services.sandboxes import sandbox_mark_healthy
from sandboxes.states import AcquisitionOutcome, JobState, SandboxSource, SandboxState
from sandman_site.errors import SandmanError

CHANNEL = "sandman_offers"
CLAIM_ATTEMPTS = 3  # offered pods tried per acquire (an unhealthy one is taken out)

_S = Sandbox._meta.db_table
_J = Job._meta.db_table


@dataclass(frozen=True)
class OfferedPod:
    """What a claimant needs of an offered row: the identity to check and answer."""

    sandbox_id: int
    name: str
    nonce: str
    backend: str
    backend_uid: str
    backend_ref: str
    address: str
    token: str


@dataclass(frozen=True)
class Claimed:
    pod: OfferedPod
    wait_ms: float


def sandbox_offer_many(*, sandbox_ids: Sequence[int], now: dt.datetime) -> list[int]:
    """Stamp warm rows offered; the ids stamped (a row no longer ``ready`` is not)."""
    with connection.cursor() as cur:
        cur.execute(
            f"UPDATE {_S} SET offered_at = %s WHERE id = ANY(%s) AND state = %s"
            " AND NOT agent_used RETURNING id",
            [now, list(sandbox_ids), SandboxState.READY],
        )
        return [row[0] for row in cur.fetchall()]


def sandbox_withdraw_offers(*, sandbox_ids: Sequence[int]) -> tuple[list[int], dict[int, str]]:
    """Take offers back: the ids withdrawn, and the state of each other row (a claimant won
    it, or it is no longer ``ready``); a row that no longer exists is in neither."""
    ids = list(sandbox_ids)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(
            f"UPDATE {_S} SET offered_at = NULL WHERE id = ANY(%s) AND state = %s"
            " AND offered_at IS NOT NULL RETURNING id",
            [ids, SandboxState.READY],
        )
        won = [row[0] for row in cur.fetchall()]
        others = [i for i in ids if i not in set(won)]
        if not others:
            return won, {}
        cur.execute(f"SELECT id, state FROM {_S} WHERE id = ANY(%s)", [others])
        return won, dict(cur.fetchall())


def sandbox_clear_offers() -> int:
    """Withdraw every offer (a controller starting: its books are rebuilt from the rows)."""
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {_S} SET offered_at = NULL WHERE offered_at IS NOT NULL")
        return cur.rowcount


def rows_not_in(*, sandbox_ids: Sequence[int], state: str) -> dict[int, str]:
    """Of these sandboxes, those whose rows are no longer in ``state``, with theirs (a
    sandbox a web worker released behind the books: ``in_use`` left)."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT id, state FROM {_S} WHERE id = ANY(%s) AND state <> %s",
            [list(sandbox_ids), state],
        )
        return dict(cur.fetchall())


def offers_gone(*, sandbox_ids: Sequence[int]) -> dict[int, str]:
    """Of these offered pods, those whose rows are no longer offered, with their state
    (the controller's books follow what a lost notification did not tell)."""
    with connection.cursor() as cur:
        cur.execute(
            f"SELECT id, state FROM {_S} WHERE id = ANY(%s)"
            " AND NOT (state = %s AND offered_at IS NOT NULL)",
            [list(sandbox_ids), SandboxState.READY],
        )
        return dict(cur.fetchall())


def sandbox_claim_offered(
    *,
    record: dict[str, Any],
    healthy: Callable[[OfferedPod], bool],
    now: Callable[[], dt.datetime],
    clock: Callable[[], float],
    started: float,
) -> Claimed | None:
    """Claim and hand out the oldest offered pod of ``record``'s job and key, or None.

    ``record`` holds the acquisition's fields (``job_id``, ``user_id``, ``role``, ``image``,
    ``key_hash``, ``started_at``, ``idempotency_key``). ``healthy`` checks the pod while its
    row is locked; one that fails is taken out of the offers and marked unhealthy, the
    controller is told (it deletes the pod), and the next offered pod is tried.

    One claim is ``BEGIN``, the row lock (the whole row, ``SKIP LOCKED``), the check, one
    send (the row, its events, the notification: ``batch.sandbox_hand_out_locked``), the
    acquisition's ``INSERT ... RETURNING`` and ``COMMIT``."""
    for _ in range(CLAIM_ATTEMPTS):
        with transaction.atomic():
            row = _lock_oldest_offered(record["job_id"], record["key_hash"])
            if row is None:
                return None
            pod = OfferedPod(
                sandbox_id=row.pk,
                name=row.name,
                nonce=row.nonce,
                backend=row.backend,
                backend_uid=row.backend_uid,
                backend_ref=row.backend_ref,
                address=row.address,
                token=row.token,
            )
            if not healthy(pod):
                _take_out_unhealthy(pod, record["job_id"], now())
                continue
            at = now()
            move = hand_out_move(
                sandbox_id=pod.sandbox_id,
                source=SandboxSource.WARM,
                role=record["role"],
                now=at,
                healthy_at=at,
            )
            move = dataclasses.replace(move, fields={**move.fields, "offered_at": None})
            wait_ms = (clock() - started) * 1000.0
            finished = {
                **record,
                "outcome": AcquisitionOutcome.OK.value,
                "queue_ms": 0.0,
                "wait_ms": wait_ms,
            }
            writes = Statements(connection)
            (answer,) = sandbox_hand_out_locked(
                locked={row.pk: row}, items=[HandOut(move=move, acquisition=finished)], into=writes
            )
            if isinstance(answer, SandmanError):
                raise answer  # the row is locked and ready: only a broken invariant gets here
            _notify(f"claimed:{record['job_id']}:{pod.sandbox_id}", into=writes)
            writes.send()
            return Claimed(pod=pod, wait_ms=wait_ms)
    return None


def sandbox_release_direct(*, sandbox_id: int, now: dt.datetime) -> None:
    """A release without a verdict, written by the caller itself: the controller's own
    release service (the row ``deleting`` with its ``PendingDelete``, or its refusal
    raised), and a ``released`` notification carrying the delete's order, in one commit.
    The controller sends the delete when it hears of it, else its next round resumes the
    stored pending delete (§7)."""
    with transaction.atomic():
        (answer,) = sandbox_release_many(
            requests=[ReleaseRequest(sandbox_id=sandbox_id, now=now, keep_grading=False)]
        )
        if isinstance(answer, SandmanError):
            raise answer
        row, order, _kept = answer
        tail = "" if order is None else json.dumps(dataclasses.asdict(order))
        _notify(f"released:{row.job_id}:{row.pk}:{tail}", into=None)


def _lock_oldest_offered(job_id: int, key_hash: str) -> Sandbox | None:
    """The whole row of the oldest offered pod of an active job's key, locked; None when
    every such row is taken or locked by another claimant."""
    rows = read_rows(
        f"WHERE job_id = %s AND key_hash = %s AND state = %s AND offered_at IS NOT NULL"
        f" AND EXISTS (SELECT 1 FROM {_J} j WHERE j.id = {_S}.job_id AND j.state = %s)"
        " ORDER BY offered_at, id LIMIT 1 FOR UPDATE SKIP LOCKED",
        [job_id, key_hash, SandboxState.READY, JobState.ACTIVE],
    )
    return next(iter(rows.values()), None)


def _take_out_unhealthy(pod: OfferedPod, job_id: int, at: dt.datetime) -> None:
    with connection.cursor() as cur:
        cur.execute(f"UPDATE {_S} SET offered_at = NULL WHERE id = %s", [pod.sandbox_id])
    sandbox_mark_healthy(sandbox_id=pod.sandbox_id, now=at, healthy=False)
    _notify(f"unhealthy:{job_id}:{pod.sandbox_id}", into=None)


def _notify(payload: str, *, into: Statements | None) -> None:
    """Sent with ``into``'s writes, or now; delivered at the commit either way."""
    sql, params = "SELECT pg_notify(%s, %s)", [CHANNEL, payload]
    if into is not None:
        into.add(sql, params)
        return
    with connection.cursor() as cur:
        cur.execute(sql, params)
