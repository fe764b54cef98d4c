"""Helpers for the REST API tests: users with DRF tokens, clients, row counts, seeded rows.

Rows that stand for sandboxes a controller made are written through the real services
(``sandbox_request`` … ``sandbox_mark_ready``) when a test needs a sandbox without
starting a controller (authorization, token-hiding and metrics tests).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib.auth import get_user_model
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from sandboxes.models import Acquisition, Job, PendingDelete, Sandbox, SandboxEvent


def make_user(username: str, *, staff: bool = False) -> tuple[Any, str]:
    user = get_user_model().objects.create_user(username=username, password="pw", is_staff=staff)
    token, _ = Token.objects.get_or_create(user=user)
    return user, token.key


def api(token: str | None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


def row_counts() -> dict[str, int]:
    """Every table a request could write: asserted unchanged after a rejected request."""
    return {
        "jobs": Job.objects.count(),
        "sandboxes": Sandbox.objects.count(),
        "events": SandboxEvent.objects.count(),
        "acquisitions": Acquisition.objects.count(),
        "pending_deletes": PendingDelete.objects.count(),
    }


def job_payload(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"name": "run-1", "egress": "deny"}
    body.update(over)
    return body


def make_job(owner: Any, **over: Any) -> Job:
    from sandboxes.services.jobs import job_create

    kwargs: dict[str, Any] = {"name": "run", "egress": "deny"}
    kwargs.update(over)
    return job_create(owner=owner, now=timezone.now(), **kwargs)


def seed_sandbox(
    job: Job,
    *,
    ready_after_s: float | None = 0.1,
    hand_out: bool = False,
    role: str = "rollout",
    requested_at: dt.datetime | None = None,
) -> Sandbox:
    """A sandbox as the controller leaves it, written through the real services.

    No backend stands behind it: for tests of reads (authorization, token hiding, metrics)
    that must not start a controller.
    """
    from sandboxes.providers.base import ReadyInfo
    from sandboxes.services import (
        sandbox_hand_out,
        sandbox_mark_creating,
        sandbox_mark_ready,
        sandbox_request,
    )

    at = requested_at or timezone.now()
    sandbox = sandbox_request(
        job=job,
        role=role,
        image="sandman/empty",
        base_commit=None,
        cpu_millis=1000,
        memory_bytes=2**30,
        workspace_bytes=None,
        key_hash="k",
        backend="local",
        now=at,
    )
    if ready_after_s is None:
        return sandbox
    sandbox_mark_creating(sandbox_id=sandbox.pk, now=at)
    ready = at + dt.timedelta(seconds=ready_after_s)
    sandbox = sandbox_mark_ready(
        sandbox_id=sandbox.pk,
        info=ReadyInfo(address="127.0.0.1:9", timeline={"ready": ready}),
        now=ready,
    )
    if hand_out:
        sandbox = sandbox_hand_out(sandbox_id=sandbox.pk, source="created", role=role, now=ready)
    return Sandbox.objects.get(pk=sandbox.pk)


def wait_for(predicate: Any, *, deadline_s: float = 60.0, what: str = "condition") -> Any:
    """Poll an observable state until it holds; fail after a generous deadline.

    A wait on a real condition (a row's state), not a timing assumption: the interval
    only bounds how often the database is asked.
    """
    import time

    end = time.monotonic() + deadline_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline_s} s waiting for {what}")
        time.sleep(0.02)
