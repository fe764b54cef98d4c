"""Rows for the batched services' tests (``services/batch.py``)."""

from __future__ import annotations

import datetime as dt

from sandboxes.models import Job
from sandboxes.services.batch import SandboxRequest


def sandbox_requests(job: Job, n: int, *, now: dt.datetime) -> list[SandboxRequest]:
    """``n`` requests for tiny rollout sandboxes of ``job`` on the local backend."""
    return [
        SandboxRequest(
            job_id=job.pk,
            role="rollout",
            image="sandman/empty",
            base_commit=None,
            cpu_millis=500,
            memory_bytes=2**28,
            workspace_bytes=None,
            key_hash="k" * 16,
            backend="local",
            now=now,
        )
        for _ in range(n)
    ]
