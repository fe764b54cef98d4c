"""Rows for the dashboard tests: jobs, sandboxes and acquisitions with chosen times.

Known-value tests need exact timestamps and durations, so these write rows directly
(bulk where many); tests of the live path use the real services instead
(``sandboxes.services``). ``T0`` is aligned to every bucket width the dashboards use.
"""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any

from django.contrib.auth import get_user_model

from sandboxes.models import Acquisition, Job, Sandbox
from sandboxes.states import AcquisitionOutcome, SandboxState

T0 = dt.datetime(2026, 10, 14, 12, 0, 0, tzinfo=dt.UTC)
_names = itertools.count(1)


def at(minutes: float = 0, seconds: float = 0, ms: int = 0) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes, seconds=seconds, milliseconds=ms)


def make_staff(username: str = "operator", password: str = "pw") -> Any:
    return get_user_model().objects.create_user(username=username, password=password, is_staff=True)


def make_job(name: str = "run", owner: Any = None) -> Job:
    if owner is None:
        owner, _ = get_user_model().objects.get_or_create(username="trainer")
    return Job.objects.create(name=name, owner=owner, created_at=T0)


def sandbox(
    job: Job,
    *,
    requested_at: dt.datetime,
    ready_after_ms: int | None = None,
    state: str = SandboxState.READY,
    image_present: bool | None = None,
    **fields: Any,
) -> Sandbox:
    """An unsaved sandbox (for bulk_create); Ready ``ready_after_ms`` after its request."""
    n = next(_names)
    ready_at = (
        requested_at + dt.timedelta(milliseconds=ready_after_ms)
        if ready_after_ms is not None
        else None
    )
    return Sandbox(
        job=job,
        name=f"sm-test-{n}",
        nonce=f"nonce-{n}",
        token=f"token-{n}",
        backend="local",
        state=state,
        image="sandman/empty",
        cpu_millis=100,
        memory_bytes=128 << 20,
        key_hash="k" * 16,
        requested_at=requested_at,
        ready_at=ready_at,
        image_present=image_present,
        **fields,
    )


def acquisition(
    job: Job,
    *,
    finished_at: dt.datetime,
    wait_ms: float | None,
    queue_ms: float | None = None,
    outcome: str = AcquisitionOutcome.OK,
    source: str = "created",
) -> Acquisition:
    """An unsaved finished acquisition (for bulk_create)."""
    return Acquisition(
        job=job,
        image="sandman/empty",
        key_hash="k" * 16,
        outcome=outcome,
        source=source,
        started_at=finished_at - dt.timedelta(milliseconds=wait_ms or 0),
        finished_at=finished_at,
        wait_ms=wait_ms,
        queue_ms=queue_ms,
    )


def ready_through_services(
    job: Job,
    *,
    requested_at: dt.datetime,
    ready_at: dt.datetime,
    image_present: bool | None = True,
) -> Sandbox:
    """A sandbox taken requested → creating → Ready by the pool's own services.

    Each service publishes its ``sandbox.state`` event after its commit, as in production.
    """
    from sandboxes.providers.base import ReadyInfo
    from sandboxes.services import sandbox_mark_creating, sandbox_mark_ready, sandbox_request

    row = sandbox_request(
        job=job,
        role="rollout",
        image="sandman/empty",
        base_commit=None,
        cpu_millis=100,
        memory_bytes=128 << 20,
        workspace_bytes=None,
        key_hash="k" * 16,
        backend="local",
        now=requested_at,
    )
    sandbox_mark_creating(sandbox_id=row.pk, now=requested_at)
    info = ReadyInfo(
        address="127.0.0.1:1",
        node="local",
        image_present=image_present,
        timeline={"ready": ready_at},
    )
    return sandbox_mark_ready(sandbox_id=row.pk, info=info, now=ready_at)


def job_through_services(name: str, owner: Any) -> Job:
    from sandboxes.services import job_create

    return job_create(owner=owner, name=name, now=T0)
