"""Rows for the grading page's tests: gradings, grading acquisitions and grading sandboxes
in the last few minutes (the pages read the real clock at the edge)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from dashboards.tests.factories import acquisition, make_job, sandbox
from grading.models import Grading, Task
from sandboxes.models import Acquisition, Job, Sandbox

REFUSED = [
    {"n": 1, "outcome": "probe_refused", "detail": "cpu_count: declared 2, read 8"},
    {"n": 2, "outcome": "infrastructure", "detail": "execd failed"},
]


def _task() -> Task:
    now = timezone.now()
    return Task.objects.create(
        instance_id="calc-1",
        repo="sandman/calc",
        base_commit="0" * 40,
        patch="",
        fail_to_pass=["t::a"],
        pass_to_pass=[],
        image="sandman/calc",
        created_at=now,
        state_changed_at=now,
    )


def seed_gradings(job_name: str = "grade-run") -> Job:
    """2 resolved, 1 unresolved, 1 no_verdict after a probe refusal; 3 grading sandboxes;
    grading acquisitions fresh (2), warm (1) and reused (2)."""
    job = make_job(job_name)
    task = _task()
    now = timezone.now()
    done = now - dt.timedelta(minutes=2)
    rows: list[dict[str, Any]] = [
        {"verdict": "resolved"},
        {"verdict": "resolved"},
        {"verdict": "unresolved"},
        {"verdict": "no_verdict", "attempts": REFUSED},
    ]
    Grading.objects.bulk_create(
        Grading(
            job=job,
            task=task,
            patch="",
            patch_sha256="e" * 64,
            suites=[],
            state="done",
            created_at=done,
            state_changed_at=done,
            finished_at=done,
            **row,
        )
        for row in rows
    )
    Sandbox.objects.bulk_create(
        sandbox(job, requested_at=now - dt.timedelta(minutes=5), role="grading") for _ in range(3)
    )
    waits = [("created", 4000), ("created", 6000), ("warm", 20), ("reused", 30), ("reused", 50)]
    made = []
    for source, wait_ms in waits:
        row = acquisition(job, finished_at=done, wait_ms=wait_ms, source=source)
        row.role = "grading"
        made.append(row)
    Acquisition.objects.bulk_create(made)
    return job
