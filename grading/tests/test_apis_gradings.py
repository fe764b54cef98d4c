"""``POST /api/v1/gradings/`` rejections: each a clear 4xx that stores nothing."""

from __future__ import annotations

from typing import Any

import pytest

from grading.models import Grading
from grading.tests.support import FIX, instance
from sandboxes.tests.api_support import api, make_job, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def setup() -> dict[str, Any]:
    user, token = make_user("alice")
    job = make_job(user)
    assert api(token).post("/api/v1/tasks/", instance(), format="json").status_code == 201
    return {"token": token, "job": job.pk}


def _rejected(setup: dict[str, Any], status: int, token: str | None = None, **body: Any) -> dict:
    payload = {"job": setup["job"], "task": "sandman__calc-1", "patch": FIX, **body}
    payload = {k: v for k, v in payload.items() if v is not None}
    response = api(token or setup["token"]).post("/api/v1/gradings/", payload, format="json")
    assert response.status_code == status, response.content
    assert Grading.objects.count() == 0
    data = response.json()
    assert data["error"] and data["detail"]
    return data


def test_an_unknown_task_is_a_404(setup):
    assert "nope" in _rejected(setup, 404, task="nope")["detail"]


def test_a_patch_that_is_not_a_diff_is_a_400(setup):
    assert "patch" in _rejected(setup, 400, patch="just text")["fields"]


def test_a_10_mb_patch_is_a_413(setup):
    assert _rejected(setup, 413, patch=FIX + "+" + "x" * (10 * 2**20))["error"] == "too_large"


def test_a_patch_and_a_capture_together_or_neither_is_a_400(setup):
    _rejected(setup, 400, capture_id=1)
    _rejected(setup, 400, patch=None)


def test_someone_elses_job_or_capture_is_a_404(setup):
    _, other = make_user("mallory")
    _rejected(setup, 404, token=other)
    _rejected(setup, 404, patch=None, capture_id=12345)


def test_an_unknown_suite_is_a_400(setup):
    assert "no suite" in _rejected(setup, 400, suites=["nightly"])["detail"]


def test_an_unknown_grading_is_a_404(setup):
    response = api(setup["token"]).get("/api/v1/gradings/999/")
    assert response.status_code == 404 and response.json()["error"] == "not_found"
