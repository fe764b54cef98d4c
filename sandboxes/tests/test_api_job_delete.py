"""DELETE /api/v1/jobs/{id}/ (issue 14, item 7): a framework that registers a job per
instance can clean up - a drained job goes with its records; an active job, one with
sandboxes not yet deleted, or another user's job is refused and nothing is removed."""

from __future__ import annotations

import pytest
from django.utils import timezone

from sandboxes.models import Job, PendingDelete, Sandbox, SandboxEvent
from sandboxes.services import (
    job_mark_drained,
    job_mark_draining,
    sandbox_begin_delete,
    sandbox_mark_gone,
)
from sandboxes.tests.api_support import api, make_job, make_user, row_counts, seed_sandbox

pytestmark = pytest.mark.django_db


def _drain(job: Job) -> None:
    job_mark_draining(job_id=job.pk, now=timezone.now())
    job_mark_drained(job_id=job.pk, now=timezone.now())


def test_a_drained_job_is_deleted_with_its_sandbox_rows_and_events():
    user, token = make_user("deleter")
    job = make_job(user, name="done")
    box = seed_sandbox(job, hand_out=True)
    client = api(token)
    refused = client.delete(f"/api/v1/jobs/{job.pk}/")
    assert refused.status_code == 409 and refused.json()["error"] == "job_not_drained"
    _drain(job)
    before = row_counts()
    left = client.delete(f"/api/v1/jobs/{job.pk}/")
    assert left.status_code == 409 and "not deleted" in left.json()["detail"]
    assert row_counts() == before  # refused: nothing removed
    sandbox_begin_delete(sandbox_id=box.pk, reason="test", now=timezone.now())
    sandbox_mark_gone(sandbox_id=box.pk, reason="test", now=timezone.now())
    PendingDelete.objects.filter(sandbox_id=box.pk).delete()  # the delete was confirmed
    assert client.delete(f"/api/v1/jobs/{job.pk}/").status_code == 204
    assert not Job.objects.filter(pk=job.pk).exists()
    assert not Sandbox.objects.filter(pk=box.pk).exists()
    assert not SandboxEvent.objects.filter(sandbox_id=box.pk).exists()
    assert client.get(f"/api/v1/jobs/{job.pk}/").status_code == 404


def test_another_users_job_is_not_found_and_kept():
    owner, _ = make_user("owner")
    _, other = make_user("other")
    job = make_job(owner, name="theirs")
    _drain(job)
    answer = api(other).delete(f"/api/v1/jobs/{job.pk}/")
    assert answer.status_code == 404 and Job.objects.filter(pk=job.pk).exists()
