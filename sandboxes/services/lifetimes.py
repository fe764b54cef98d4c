"""Extending a handed-out sandbox's lifetime (``renew``), so a long agent run is not
reclaimed at its job's ``max_lifetime_s``.

Invariant: a renew only ever moves the reclaim deadline later (to ``now + ttl_s`` when
that is later than the current one), only for an in-use sandbox, and records one
``renewed`` event; a renew claims a hand-out a restart cut (services/recovery.py); the
reclaim (``controller.queries.expired_in_use``) adds the
sandbox's ``lifetime_extra_s`` to its job's lifetime.
"""

from __future__ import annotations

import datetime as dt

from django.db import transaction

from sandboxes.models import Sandbox, SandboxEvent
from sandboxes.services.recovery import sandbox_claim_unclaimed_locked
from sandboxes.states import SandboxState
from sandman_site.errors import InvalidTransition, NotFound

MAX_RENEW_S = 7 * 86_400.0
RENEWED = "renewed"


def sandbox_expires_at(sandbox: Sandbox) -> dt.datetime | None:
    """When the reclaim takes the sandbox back (None unless handed out)."""
    if sandbox.acquired_at is None:
        return None
    lifetime = sandbox.job.max_lifetime_s + sandbox.lifetime_extra_s
    return sandbox.acquired_at + dt.timedelta(seconds=lifetime)


def sandbox_renew(*, sandbox_id: int, ttl_s: float, now: dt.datetime) -> dt.datetime:
    """Keep the in-use sandbox at least ``ttl_s`` seconds from ``now``; the new deadline."""
    with transaction.atomic():
        sandbox = (
            Sandbox.objects.select_for_update(of=("self",))
            .select_related("job")
            .filter(pk=sandbox_id)
            .first()
        )
        if sandbox is None:
            raise NotFound(f"sandbox {sandbox_id} does not exist")
        expires = sandbox_expires_at(sandbox)
        if sandbox.state != SandboxState.IN_USE or expires is None:
            raise InvalidTransition(
                f"sandbox {sandbox.name} is {sandbox.state}, not in use: nothing to renew",
                {"state": sandbox.state, "failure_reason": sandbox.failure_reason},
            )
        # A renew proves its trainer holds the sandbox: a hand-out a restart cut is its.
        sandbox_claim_unclaimed_locked(sandbox, now=now)
        wanted = now + dt.timedelta(seconds=ttl_s)
        if wanted > expires:
            sandbox.lifetime_extra_s += (wanted - expires).total_seconds()
            sandbox.save(update_fields=["lifetime_extra_s", "updated_at"])
            expires = wanted
        SandboxEvent.objects.create(
            sandbox=sandbox,
            at=now,
            kind=RENEWED,
            detail={"ttl_s": ttl_s, "expires_at": expires.isoformat()},
        )
        return expires
