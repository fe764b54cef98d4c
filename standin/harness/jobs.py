"""The job a trial drives: its image, its resource spec and how it is registered.

The harness's own copy of what ``sandboxes/tests/controller_support.py`` gives the
controller tests (the harness must not import test modules): the job is made through the
real service (``job_create``), never by writing rows directly.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib.auth import get_user_model

from sandboxes.models import Job
from sandboxes.services import job_create

MiB = 2**20
SPEC: dict[str, Any] = {"cpu_millis": 500, "memory_bytes": 256 * MiB, "workspace_bytes": None}
IMAGE = "sandman/empty"


def make_job(**over: Any) -> Job:
    """A job of the trainer user (created on first use); ``over`` overrides any field."""
    owner, _ = get_user_model().objects.get_or_create(username="trainer")
    # The stand-in's image is a tag reference; these trials exercise ownership, not the
    # digest rule for warm grading pods (sandboxes.imagerefs), so the job opts in.
    kwargs: dict[str, Any] = {"name": "run", "egress": "allow", "reuse_allow_tags": True}
    kwargs.update(over)
    return job_create(owner=owner, now=dt.datetime.now(dt.UTC), **kwargs)
