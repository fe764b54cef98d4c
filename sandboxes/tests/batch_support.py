"""Rows for the batched services' tests (``services/batch.py``)."""

from __future__ import annotations

import datetime as dt

from sandboxes.models import Job
from sandboxes.services.batch import SandboxRequest

# A tiny rollout sandbox of the empty image on the local backend: a request's fields but
# its job and time.
TINY_REQUEST = {
    "role": "rollout",
    "image": "sandman/empty",
    "base_commit": None,
    "cpu_millis": 500,
    "memory_bytes": 2**28,
    "workspace_bytes": None,
    "key_hash": "k" * 16,
    "backend": "local",
}


def sandbox_requests(job: Job, n: int, *, now: dt.datetime) -> list[SandboxRequest]:
    """``n`` requests for tiny rollout sandboxes of ``job`` on the local backend."""
    return [SandboxRequest(job_id=job.pk, now=now, **TINY_REQUEST) for _ in range(n)]  # type: ignore[arg-type]
