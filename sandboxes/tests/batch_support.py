"""Rows for the batched services' tests (``services/batch.py``)."""

from __future__ import annotations

import datetime as dt

from sandboxes.models import Job, Sandbox
from sandboxes.services.batch import SandboxRequest, sandbox_moves_apply
from sandboxes.services.moves import hand_out_move
from sandboxes.states import SandboxState

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


def hand_out_created(sandbox_id: int, *, acquisition_id: int, now: dt.datetime) -> Sandbox:
    """A created pod's hand-out as the controller writes it (``creates.py``): the row moved
    in use, the move naming the acquisition ``acquisition_id`` if it is still ``pending``."""
    [moved] = sandbox_moves_apply(
        moves=[
            hand_out_move(
                sandbox_id=sandbox_id,
                source="created",
                role="rollout",
                now=now,
                acquisition_id=acquisition_id,
            )
        ]
    )
    assert isinstance(moved, Sandbox) and moved.state == SandboxState.IN_USE
    return moved
