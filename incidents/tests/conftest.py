"""Shared helpers for the incidents tests: users, API clients, and recorded rows.

Jobs, sandboxes, events and acquisitions are written through the ORM as the controller
records them (the sandboxes services are built in parallel); nothing here is faked.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from sandboxes.models import Acquisition, Job, Sandbox, SandboxEvent

T0 = datetime.fromisoformat("2026-10-14T19:00:00+00:00")
_names = itertools.count()


@pytest.fixture
def staff_user(db: Any) -> Any:
    return get_user_model().objects.create_user(
        "operator", password="pw-operator", is_staff=True, is_superuser=True
    )


@pytest.fixture
def plain_user(db: Any) -> Any:
    return get_user_model().objects.create_user("trainer", password="pw-trainer")


def token_client(user: Any) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def staff_api(staff_user: Any) -> APIClient:
    return token_client(staff_user)


@pytest.fixture
def plain_api(plain_user: Any) -> APIClient:
    return token_client(plain_user)


def make_job(owner: Any = None, *, name: str = "job") -> Job:
    if owner is None:
        owner, _ = get_user_model().objects.get_or_create(username="job-owner")
    return Job.objects.create(name=name, owner=owner, created_at=T0 - timedelta(hours=1))


def make_sandbox(job: Job, *, at: datetime = T0, **fields: Any) -> Sandbox:
    n = next(_names)
    values = {
        "job": job,
        "name": f"sbx-{n:06d}",
        "nonce": f"nonce-{n}",
        "token": f"token-{n}",
        "backend": "kubernetes",
        "image": "swe/task:1",
        "cpu_millis": 2000,
        "memory_bytes": 8 * 2**30,
        "key_hash": "k" * 8,
        "requested_at": at,
    }
    values.update(fields)
    return Sandbox.objects.create(**values)


def record(sandbox: Sandbox, kind: str, at: datetime, **detail: Any) -> SandboxEvent:
    return SandboxEvent.objects.create(sandbox=sandbox, kind=kind, at=at, detail=detail)


def acquisition(
    job: Job, outcome: str, at: datetime, sandbox: Sandbox | None = None
) -> Acquisition:
    return Acquisition.objects.create(
        job=job,
        sandbox=sandbox,
        image="swe/task:1",
        key_hash="k" * 8,
        outcome=outcome,
        started_at=at - timedelta(seconds=120),
        finished_at=at,
    )


def case_body(**overrides: Any) -> dict[str, Any]:
    """A valid API body for one incident; override fields per test."""
    body: dict[str, Any] = {
        "title": "Admission webhook collapse",
        "started_at": "2026-10-14T19:00:00Z",
        "ended_at": "2026-10-14T22:10:00Z",
        "stage": "service_admission",
        "what_happened": "The policy webhook answered pod creates with HTTP 500.",
        "how_found": "Audit log.",
        "cause": "One webhook replica with a small memory limit.",
        "root_cause": ["cluster_service"],
        "trigger": "An unpaced burst of creates.",
        "fix": "Three replicas; paced creates.",
        "how_verified": "Paced ramp without admission errors.",
        "evidence_kind": "controlled",
        "effect": "5,217 of 6,144 trajectories failed.",
        "gpu_hours_low": 973,
        "gpu_hours_high": 1145,
        "gpu_hours_basis": "allocated",
        "workload": "evaluation",
        "status": "fixed",
    }
    body.update(overrides)
    return body
