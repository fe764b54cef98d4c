"""Shadow grading: a grading asked with ``shadow: true`` is graded again on a never-used
sandbox after its verdict, and the agreement is stored and served (REST, admin).

Real execd, the local backend, git and pytest; the runner is driven with ``run_once``.
"""

from __future__ import annotations

from typing import Any

import pytest

from grading.models import Grading
from grading.runner import GradingRunner
from grading.tests import harness_support as hs
from grading.tests.support import instance
from sandboxes.tests.api_support import api, make_job

pytestmark = pytest.mark.django_db(transaction=True)


def _grade(token: str, job_id: int, patch: str, **extra: Any) -> int:
    body = {"job": job_id, "task": "calc-1", "patch": patch, **extra}
    response = api(token).post("/api/v1/gradings/", body, format="json")
    assert response.status_code == 202, response.content
    return response.json()["id"]


def test_a_shadow_grades_on_a_never_used_sandbox_while_the_verdict_came_from_a_reused_one(
    grading_controller, grader, repo, admin_client
):
    user, token = grader
    body = instance(
        instance_id="calc-1",
        base_commit=repo.base_commit,
        patch=repo.fix,
        test_patch=repo.test_patch,
        image=repo.image,
        FAIL_TO_PASS=hs.F2P,
        PASS_TO_PASS=hs.P2P,
        suites=[{"name": "unit", "command": hs.PYTEST, "time_limit_s": 120}],
    )
    assert api(token).post("/api/v1/tasks/", body, format="json").status_code == 201
    job = make_job(user, egress="allow", reuse_enabled=True)
    runner = GradingRunner(controller=grading_controller, acquire_timeout_s=60)

    first = _grade(token, job.pk, repo.fix)
    assert runner.run_once() is True
    grading_controller.wait_idle()  # the first sandbox is checked and back in the pool
    plain = api(token).get(f"/api/v1/gradings/{first}/").json()
    assert (plain["shadow_requested"], plain["shadow"], plain["shadow_agrees"]) == (
        False,
        {},
        None,
    )

    second = _grade(token, job.pk, repo.fix, shadow=True)
    assert runner.run_once() is True
    data = api(token).get(f"/api/v1/gradings/{second}/").json()
    [attempt] = data["attempts"]
    assert (attempt["source"], attempt["sandbox_id"]) == (
        "reused",
        plain["attempts"][0]["sandbox_id"],
    )
    shadow = data["shadow"]
    assert shadow["source"] == "created" and shadow["sandbox_id"] != attempt["sandbox_id"]
    assert (data["verdict"], shadow["verdict"], data["shadow_agrees"]) == (
        "resolved",
        "resolved",
        True,
    )

    listing = admin_client.get("/admin/grading/grading/?shadow_agrees__exact=1")
    assert listing.status_code == 200
    assert f"/admin/grading/grading/{second}/change/" in listing.content.decode()
    assert f"/admin/grading/grading/{first}/change/" not in listing.content.decode()
    assert Grading.objects.get(pk=second).shadow_agrees is True
