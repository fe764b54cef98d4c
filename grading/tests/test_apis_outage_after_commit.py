"""The database lost right after a grading write's COMMIT: the answer still tells the truth.

``dbguard``'s 503 says nothing was stored; a view that queries again after its service
committed (to build the answer) would say so for a task, a task set, a certification, a
capture or a grading that WAS stored, and a client that retries stores it twice. Each
mutating endpoint here runs with every query after its COMMIT failing as a dropped
connection does (``sandman_site.testing.dbloss``) and must still answer its 2xx, built
from what its transaction wrote.
"""

from __future__ import annotations

from typing import Any

import pytest

from grading.models import Certification, Grading, PatchCapture, Task, TaskSet
from grading.tests.support import FIX, instance
from sandboxes.tests.api_support import api, make_job, make_user
from sandman_site.testing.dbloss import database_lost_after_commit_of

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def owner() -> dict[str, Any]:
    user, token = make_user("alice")
    return {"user": user, "token": token, "api": api(token)}


def _stored_task(client: Any, **over: Any) -> dict[str, Any]:
    response = client.post("/api/v1/tasks/", instance(**over), format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_a_task_create_answers_201_when_the_database_goes_after_its_commit(owner):
    with database_lost_after_commit_of("grading_task") as state:
        response = owner["api"].post("/api/v1/tasks/", instance(), format="json")
    assert state["committed"] == 1
    assert response.status_code == 201, response.content
    assert response.json()["instance_id"] == "sandman__calc-1"
    assert Task.objects.filter(instance_id="sandman__calc-1").exists()


def test_a_task_set_create_answers_201_with_its_tasks_when_the_database_goes_after_commit(
    owner,
):
    _stored_task(owner["api"])
    body = {"name": "set-1", "tasks": ["sandman__calc-1"]}
    with database_lost_after_commit_of("grading_taskset") as state:
        response = owner["api"].post("/api/v1/task-sets/", body, format="json")
    assert state["committed"] == 1
    assert response.status_code == 201, response.content
    assert response.json()["tasks"] == ["sandman__calc-1"]
    assert TaskSet.objects.filter(name="set-1").exists()


def test_a_preflight_answers_202_when_the_database_goes_after_its_commit(owner):
    _stored_task(owner["api"])
    group = owner["api"].post(
        "/api/v1/task-sets/", {"name": "set-2", "tasks": ["sandman__calc-1"]}, format="json"
    )
    assert group.status_code == 201, group.content
    job = make_job(owner["user"])
    with database_lost_after_commit_of("grading_certification") as state:
        response = owner["api"].post(
            f"/api/v1/task-sets/{group.json()['id']}/preflight/", {"job": job.pk}, format="json"
        )
    assert state["committed"] == 1
    assert response.status_code == 202, response.content
    assert Certification.objects.filter(pk=response.json()["id"]).exists()


def test_a_grading_create_answers_202_when_the_database_goes_after_its_commit(owner):
    _stored_task(owner["api"])
    job = make_job(owner["user"])
    body = {"job": job.pk, "task": "sandman__calc-1", "patch": FIX}
    with database_lost_after_commit_of("grading_grading") as state:
        response = owner["api"].post("/api/v1/gradings/", body, format="json")
    assert state["committed"] == 1
    assert response.status_code == 202, response.content
    assert Grading.objects.filter(pk=response.json()["id"]).exists()


def test_a_capture_answers_201_when_the_database_goes_after_its_commit(sandboxes, grader, repo):
    client = api(grader[1])
    body = instance(
        instance_id="calc-1",
        base_commit=repo.base_commit,
        patch=repo.fix,
        test_patch=repo.test_patch,
        image=repo.image,
    )
    assert client.post("/api/v1/tasks/", body, format="json").status_code == 201
    box = sandboxes("rollout")
    with database_lost_after_commit_of("grading_patchcapture") as state:
        response = client.post(
            f"/api/v1/sandboxes/{box.sandbox_id}/capture/", {"task": "calc-1"}, format="json"
        )
    assert state["committed"] == 1
    assert response.status_code == 201, response.content
    assert PatchCapture.objects.filter(pk=response.json()["id"]).exists()
