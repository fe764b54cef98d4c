"""``POST /api/v1/sandboxes/{id}/capture/`` on a real rollout sandbox: owner only, stored with
its SHA-256, test-configuration files left out; bad requests store nothing."""

from __future__ import annotations

import hashlib

import pytest

from grading.models import PatchCapture
from grading.tests import harness_support as hs
from grading.tests.support import instance
from sandboxes.tests.api_support import api, make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def task(grader, repo):
    body = instance(
        instance_id="calc-1",
        base_commit=repo.base_commit,
        patch=repo.fix,
        test_patch=repo.test_patch,
        image=repo.image,
    )
    response = api(grader[1]).post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def _agent_edits(box) -> None:
    async def work(execd):
        command = (
            "printf 'def add(a, b):\\n    return a + b\\n' > calc.py && "
            "printf 'import calc\\n' > tests/conftest.py"
        )
        assert (await execd.exec(command, timeout_s=30)).exit_code == 0

    hs.with_execd(box.address, box.token, work)


def test_the_owner_captures_the_agents_patch_stored_with_its_sha256(sandboxes, grader, task):
    box = sandboxes("rollout")
    _agent_edits(box)
    response = api(grader[1]).post(
        f"/api/v1/sandboxes/{box.sandbox_id}/capture/", {"task": "calc-1"}, format="json"
    )
    assert response.status_code == 201, response.content
    data = response.json()
    stored = PatchCapture.objects.get(pk=data["id"])
    assert stored.patch == data["patch"] and "diff --git a/calc.py b/calc.py" in stored.patch
    assert "conftest.py" not in stored.patch
    assert data["sha256"] == hashlib.sha256(stored.patch.encode()).hexdigest() == stored.sha256
    assert (data["task"], data["sandbox"], data["size"]) == (
        "calc-1",
        box.sandbox_id,
        len(stored.patch.encode()),
    )


def test_another_trainer_an_unknown_task_or_a_grading_sandbox_store_nothing(
    sandboxes, grader, task
):
    box = sandboxes("rollout")
    _, other = make_user("mallory")
    url = f"/api/v1/sandboxes/{box.sandbox_id}/capture/"
    someone_else = api(other).post(url, {"task": "calc-1"}, format="json")
    assert someone_else.status_code == 404 and someone_else.json()["error"] == "not_found"
    unknown = api(grader[1]).post(url, {"task": "nope"}, format="json")
    assert unknown.status_code == 404 and "nope" in unknown.json()["detail"]
    typo = api(grader[1]).post(url, {"taks": "calc-1"}, format="json")
    assert typo.status_code == 400
    grading_box = sandboxes("grading")
    wrong_role = api(grader[1]).post(
        f"/api/v1/sandboxes/{grading_box.sandbox_id}/capture/", {"task": "calc-1"}, format="json"
    )
    assert wrong_role.status_code == 409 and wrong_role.json()["error"] == "invalid_transition"
    assert PatchCapture.objects.count() == 0
