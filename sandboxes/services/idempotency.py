"""Recorded answers of REST calls sent with an ``Idempotency-Key`` (acquire, release).

Invariants: one row per (route, scope, key) - the first answer recorded wins and a
concurrent second record returns the first; a row never holds a token; pruning removes
only rows older than the given age (the table is bounded in time, keys are not reused).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import IntegrityError, transaction

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
    """Record ``answer`` for the key, or return the one already recorded."""
    try:
        with transaction.atomic():
            IdempotentCall.objects.create(
                route=route,
                scope=scope,
                key=key,
                answer=answer,
                sandbox_id=sandbox_id,
                created_at=now,
            )
        return answer
    except IntegrityError:
        first = IdempotentCall.objects.get(route=route, scope=scope, key=key)
        return dict(first.answer)


def idempotent_call_prune(*, now: dt.datetime, max_age_s: float = IDEMPOTENCY_TTL_S) -> int:
    """Delete records older than ``max_age_s``; how many."""
    cutoff = now - dt.timedelta(seconds=max_age_s)
    deleted, _ = IdempotentCall.objects.filter(created_at__lt=cutoff).delete()
    return deleted
