"""The database lost right after a write's COMMIT: the answer still tells the truth.

``dbguard`` promises that a 503 means nothing was stored. A view that reads again after its
service committed (to build the answer) breaks that promise when PostgreSQL goes away
between the two: the row is there and the client is told it is not, so a trainer that
retries registers the job twice (seen in ``test_chaos_postgres``). Here the loss is
placed exactly (``sandman_site.testing.dbloss``): every query after the COMMIT that wrote
the row fails the way a dropped connection does (``OperationalError``), and each mutating
endpoint must still answer its 2xx, built from what its transaction wrote. Where the
controller does the write (acquire, release, drain), its threads' connections meet the
same loss (``every_thread``; the controller is started inside the block).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sandboxes.controller import Controller
from sandboxes.models import Acquisition, Job, LearnerStep, Sandbox, Trajectory
from sandboxes.services.jobs import job_mark_drained, job_mark_draining
from sandboxes.states import AcquisitionOutcome, JobState, SandboxState
from sandboxes.tests.api_support import (
    api,
    job_payload,
    make_job,
    make_user,
    seed_sandbox,
    wait_for,
)
from sandboxes.tests.test_api_trajectories import learner_step, trajectory
from sandman_site.testing.dbloss import (
    database_lost_after_commit,
    database_lost_after_commit_of,
    writes_to,
)

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = {"cpu": "500m", "memory": "256Mi"}


def test_a_job_create_answers_201_from_what_it_wrote_when_the_database_goes_after_commit():
    _, token = make_user("alice")
    client = api(token)
    with database_lost_after_commit_of("sandboxes_job") as state:
        response = client.post("/api/v1/jobs/", job_payload(name="after-commit"), format="json")
    assert state["committed"] == 1  # the loss really happened after the COMMIT
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["name"] == "after-commit"
    assert data["counts"] == {"live": 0, "warm": 0, "creating": 0}
    assert Job.objects.filter(pk=data["id"], name="after-commit").exists()


def test_the_harness_does_refuse_queries_after_the_commit():
    """The fault is real: a read after the COMMIT meets it (and answers 503, not 500)."""
    _, token = make_user("bob")
    client = api(token)
    with database_lost_after_commit_of("sandboxes_job") as state:
        created = client.post("/api/v1/jobs/", job_payload(name="b"), format="json")
        listed = client.get("/api/v1/jobs/")
    assert created.status_code == 201
    assert state["refused"] >= 1
    assert listed.status_code == 503
    assert listed.json()["error"] == "database_unavailable"


def test_a_job_delete_answers_204_when_the_database_goes_after_its_commit():
    user, token = make_user("carol")
    job = make_job(user)
    job_mark_draining(job_id=job.pk, now=job.created_at)
    job_mark_drained(job_id=job.pk, now=job.created_at)
    with database_lost_after_commit_of("sandboxes_job") as state:
        response = api(token).delete(f"/api/v1/jobs/{job.pk}/")
    assert state["committed"] == 1
    assert response.status_code == 204, response.content
    assert not Job.objects.filter(pk=job.pk).exists()


def test_a_renew_answers_its_deadline_when_the_database_goes_after_its_commit():
    user, token = make_user("dave")
    sandbox = seed_sandbox(make_job(user), hand_out=True)
    with database_lost_after_commit_of("sandboxes_sandboxevent") as state:
        response = api(token).post(
            f"/api/v1/sandboxes/{sandbox.pk}/renew/", {"ttl_s": 7200}, format="json"
        )
    assert state["committed"] == 1
    assert response.status_code == 200, response.content
    assert response.json()["sandbox_id"] == sandbox.pk
    assert Sandbox.objects.get(pk=sandbox.pk).lifetime_extra_s > 0


@pytest.mark.parametrize(
    "route,body,table,model",
    [
        ("trajectories", {"trajectories": [trajectory("t1")]}, "sandboxes_trajectory", Trajectory),
        ("learner-steps", {"steps": [learner_step(1)]}, "sandboxes_learnerstep", LearnerStep),
    ],
)
def test_an_ingest_answers_its_counts_when_the_database_goes_after_its_commit(
    route: str, body: dict[str, Any], table: str, model: Any
):
    user, token = make_user("erin")
    job = make_job(user)
    with database_lost_after_commit_of(table) as state:
        response = api(token).post(f"/api/v1/jobs/{job.pk}/{route}/", body, format="json")
    assert state["committed"] == 1
    assert response.status_code == 200, response.content
    assert response.json()["stored"] == 1
    assert model.objects.count() == 1


def _values(params: Any) -> set[Any]:
    """The parameters of one statement, or of every row of an ``executemany``."""
    rows = params if params and isinstance(params[0], list | tuple) else [params or ()]
    return {value for row in rows for value in row if isinstance(value, str)}


def _handed_out(sql: str, params: Any) -> bool:
    return writes_to("sandboxes_sandbox")(sql, params) and SandboxState.IN_USE in _values(params)


def _released(sql: str, params: Any) -> bool:
    states = {SandboxState.RELEASED.value, SandboxState.DELETING.value}
    return writes_to("sandboxes_sandbox")(sql, params) and bool(states & _values(params))


@pytest.mark.parametrize("idempotency_key", [None, "acq-1"])
def test_an_acquire_answers_its_sandbox_when_the_database_goes_after_the_hand_out(
    make_controller: Callable[..., Controller], idempotency_key: str | None
):
    """Two commits follow the hand-out (the acquisition's finish, the idempotency record):
    losing the database before them must not hide the sandbox the caller now holds."""
    user, token = make_user("frank")
    job = make_job(user, egress="allow")
    headers = {} if idempotency_key is None else {"HTTP_IDEMPOTENCY_KEY": idempotency_key}
    body = {"image": "sandman/empty", "spec": SPEC, "timeout_s": 60}
    with database_lost_after_commit(_handed_out, every_thread=True) as state:
        make_controller()
        response = api(token).post(
            f"/api/v1/jobs/{job.pk}/acquire/", body, format="json", **headers
        )
    assert state["committed"] == 1
    assert response.status_code == 200, response.content
    sandbox_id = response.json()["sandbox_id"]
    assert Sandbox.objects.get(pk=sandbox_id).state == SandboxState.IN_USE
    # the acquisition's finish is written once the database is back
    wait_for(
        lambda: Acquisition.objects.filter(
            sandbox_id=sandbox_id, outcome=AcquisitionOutcome.OK
        ).exists(),
        what="the acquisition's ok row",
    )


def test_a_release_answers_200_when_the_database_goes_after_its_commit(
    make_controller: Callable[..., Controller],
):
    user, token = make_user("grace")
    job = make_job(user, egress="allow")
    client = api(token)
    body = {"image": "sandman/empty", "spec": SPEC, "timeout_s": 60}
    with database_lost_after_commit(_released, every_thread=True) as state:
        make_controller()
        acquired = client.post(f"/api/v1/jobs/{job.pk}/acquire/", body, format="json")
        assert acquired.status_code == 200, acquired.content
        sandbox_id = acquired.json()["sandbox_id"]
        response = client.post(f"/api/v1/sandboxes/{sandbox_id}/release/", {}, format="json")
    assert state["committed"] == 1
    assert response.status_code == 200, response.content
    assert response.json() == {"sandbox_id": sandbox_id, "released": True}
    assert Sandbox.objects.get(pk=sandbox_id).state != SandboxState.IN_USE


def test_a_drain_answers_202_when_the_database_goes_after_its_commit(
    make_controller: Callable[..., Controller],
):
    user, token = make_user("heidi")
    job = make_job(user)
    with database_lost_after_commit_of("sandboxes_job", every_thread=True) as state:
        make_controller()
        response = api(token).post(f"/api/v1/jobs/{job.pk}/drain/", {}, format="json")
    assert state["committed"] == 1
    assert response.status_code == 202, response.content
    assert Job.objects.get(pk=job.pk).state != JobState.ACTIVE
