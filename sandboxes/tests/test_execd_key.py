"""A job's execd key: random per job, the root of its sandboxes' tokens, shown nowhere.

Issue 9 item 2: a sandbox's token is HMAC-SHA256(job key, sandbox name) in hex, written on
the row by ``sandbox_request`` for both backends, so the row's token is what the sandbox's
execd derives from the key and its own name (``execd/tokens.py``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from sandboxes.models import Job
from sandboxes.services import sandbox_request
from sandboxes.tests.api_support import api, make_job, make_user

pytestmark = pytest.mark.django_db
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _request(job: Job) -> Any:
    return sandbox_request(
        job=job,
        role="rollout",
        image="task/img:1",
        base_commit=None,
        cpu_millis=500,
        memory_bytes=2**30,
        workspace_bytes=None,
        key_hash="k" * 16,
        backend="local",
        now=T0,
    )


def test_every_job_has_its_own_random_key() -> None:
    user, _ = make_user("alice")
    a, b = make_job(user), make_job(user)
    assert len(a.execd_key) == 64 and int(a.execd_key, 16) >= 0
    assert a.execd_key != b.execd_key


def test_a_sandboxs_token_is_the_hmac_of_its_name_under_the_jobs_key() -> None:
    user, _ = make_user("alice")
    job = make_job(user)
    one, two = _request(job), _request(job)
    for row in (one, two):
        expected = hmac.new(job.execd_key.encode(), row.name.encode(), hashlib.sha256)
        assert row.token == expected.hexdigest()
    assert one.token != two.token
    by_id = sandbox_request(**{**_kwargs(), "job_id": job.pk})
    assert (
        by_id.token == hmac.new(job.execd_key.encode(), by_id.name.encode(), "sha256").hexdigest()
    )


def _kwargs() -> dict[str, Any]:
    return {
        "role": "rollout",
        "image": "task/img:1",
        "base_commit": None,
        "cpu_millis": 500,
        "memory_bytes": 2**30,
        "workspace_bytes": None,
        "key_hash": "k" * 16,
        "backend": "local",
        "now": T0,
    }


def test_the_key_is_in_no_api_answer() -> None:
    _, token = make_user("alice")
    created = api(token).post("/api/v1/jobs/", {"name": "j", "egress": "allow"}, format="json")
    assert created.status_code == 201
    key = Job.objects.get(pk=created.json()["id"]).execd_key
    answers = [
        created.content,
        api(token).get("/api/v1/jobs/").content,
        api(token).get(f"/api/v1/jobs/{created.json()['id']}/").content,
    ]
    assert all(key.encode() not in body and b"execd_key" not in body for body in answers)


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_each_existing_job_a_key_of_its_own() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([("sandboxes", "0001_initial")])
    old = MigrationExecutor(connection).loader.project_state([("sandboxes", "0001_initial")])
    OldJob = old.apps.get_model("sandboxes", "Job")
    user, _ = make_user("alice")
    ids = [OldJob.objects.create(name=f"j{i}", owner_id=user.pk, created_at=T0).pk for i in (1, 2)]
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    keys = [Job.objects.get(pk=pk).execd_key for pk in ids]
    assert all(len(k) == 64 for k in keys) and keys[0] != keys[1]
