"""The controller's row reads (controller/queries.py): the bulk reads a reconcile and a drain
make (``rows_not_deleted``, ``rows_of_job``) answer exactly what the per-row read answers."""

from __future__ import annotations

import datetime as dt

import pytest

from sandboxes.controller import queries
from sandboxes.models import Sandbox
from sandboxes.services import sandbox_request
from sandboxes.tests.controller_support import IMAGE, SPEC, make_job

pytestmark = pytest.mark.django_db


def _request(job_id: int, backend: str = "local") -> Sandbox:
    return sandbox_request(
        job_id=job_id,
        role="rollout",
        image=IMAGE,
        base_commit=None,
        key_hash="0" * 16,
        backend=backend,
        now=dt.datetime.now(dt.UTC),
        **SPEC,
    )


def test_the_bulk_row_reads_answer_what_the_per_row_read_answers():
    job = make_job()
    plain = _request(job.pk)
    used = _request(job.pk)
    Sandbox.objects.filter(pk=used.pk).update(
        state="in_use",
        agent_used=True,
        reuse_count=2,
        reuse_verdicts={"abc": "pass"},
        acquired_at=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        workspace_bytes=2**30,
        address="10.0.0.7:8700",
        backend_uid="uid-1",
    )
    gone = _request(job.pk)
    Sandbox.objects.filter(pk=gone.pk).update(state="deleted")
    other = _request(job.pk, backend="kubernetes")
    expected = [queries.sandbox_row(pk) for pk in (plain.pk, used.pk)]
    assert queries.rows_of_job(job_id=job.pk) == [*expected, queries.sandbox_row(other.pk)]
    assert queries.rows_not_deleted(backend="local") == expected
    assert expected[1] is not None and expected[1].reuse_verdicts == {"abc": "pass"}
    assert expected[1].job_state == job.state
