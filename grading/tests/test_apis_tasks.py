"""REST API for tasks and task sets: the SWE-bench instance format, defaults, bounds, errors.

Every rejected request is checked to store nothing (``grading_counts`` unchanged) and to
answer ``{error, detail}`` with a 4xx.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from grading.models import DEFAULT_EXCLUDED_TEST_CONFIG, Task, TaskSet
from grading.tests.support import FIX, grading_counts, instance
from sandboxes.tests.api_support import api, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def token() -> str:
    return make_user("alice")[1]


def _rejected(token: str, body: Any, status: int = 400) -> dict[str, Any]:
    before = grading_counts()
    response = api(token).post("/api/v1/tasks/", body, format="json")
    assert response.status_code == status, response.content
    data = response.json()
    assert set(data) >= {"error", "detail"} and data["detail"]
    assert grading_counts() == before
    return data


def test_a_swe_bench_instance_with_json_encoded_test_lists_is_stored_with_our_defaults(token):
    response = api(token).post("/api/v1/tasks/", instance(), format="json")
    assert response.status_code == 201, response.content
    task = Task.objects.get(instance_id="sandman__calc-1")
    assert task.fail_to_pass == ["tests/test_calc.py::test_add"]
    assert task.pass_to_pass == ["tests/test_calc.py::test_add_zero"]
    assert task.patch == FIX and task.base_commit.startswith("0123456")
    assert task.suites == [
        {"name": "default", "command": "python -m pytest -rA", "time_limit_s": 1800.0}
    ]
    assert task.excluded_test_config == list(DEFAULT_EXCLUDED_TEST_CONFIG)
    assert task.conditions == {} and task.state == "active"
    data = response.json()
    assert data["FAIL_TO_PASS"] == ["tests/test_calc.py::test_add"]
    assert data["suites"][0]["time_limit_s"] == 1800.0
    assert "hints_text" not in data and "created_at" in data


def test_test_lists_given_as_json_lists_are_stored_the_same(token):
    body = instance(FAIL_TO_PASS=["a::x", "a::y"], PASS_TO_PASS=[])
    response = api(token).post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 201, response.content
    task = Task.objects.get()
    assert (task.fail_to_pass, task.pass_to_pass) == (["a::x", "a::y"], [])


def test_our_fields_suites_conditions_and_exclusions_are_stored_normalised(token):
    body = instance(
        suites=[
            {"name": "unit", "command": "pytest -rA tests/unit", "time_limit_s": 60},
            {"name": "slow"},
        ],
        conditions={
            "egress": "deny",
            "cpu_quota": "500m",
            "visible_cpus": 2,
            "memory_limit": "1Gi",
            "user": "sandman",
            "time_zone": "Europe/Berlin",
            "hash_seed": "0",
            "time_limit_s": 900,
        },
        excluded_test_config=["conftest.py", "tests/data/settings.ini"],
    )
    response = api(token).post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 201, response.content
    task = Task.objects.get()
    assert task.suites == [
        {"name": "unit", "command": "pytest -rA tests/unit", "time_limit_s": 60.0},
        {"name": "slow", "command": "python -m pytest -rA", "time_limit_s": 1800.0},
    ]
    assert task.conditions == {
        "egress": "deny",
        "cpu_quota_millis": 500,
        "visible_cpus": 2,
        "memory_limit_bytes": 1024**3,
        "user": "sandman",
        "time_zone": "Europe/Berlin",
        "hash_seed": "0",
        "time_limit_s": 900.0,
    }
    assert task.excluded_test_config == ["conftest.py", "tests/data/settings.ini"]


@pytest.mark.parametrize(
    "field, value",
    [
        ("FAIL_TO_PASS", "tests/test_calc.py::test_add"),  # a bare string, not a list
        ("FAIL_TO_PASS", json.dumps({"a": 1})),
        ("FAIL_TO_PASS", {"a": 1}),
        ("FAIL_TO_PASS", []),  # nothing the fix must make pass
        ("FAIL_TO_PASS", [1, 2]),
        ("PASS_TO_PASS", "not json"),
        ("PASS_TO_PASS", ["a::x", "a::x"]),
    ],
)
def test_a_test_list_that_is_not_a_list_of_test_ids_is_a_400(token, field, value):
    data = _rejected(token, instance(**{field: value}))
    assert data["error"] == "invalid" and field in data["fields"]


def test_a_patch_that_is_not_a_diff_is_a_400(token):
    data = _rejected(token, instance(patch="return a + b\n"))
    assert "patch" in data["fields"] and "diff" in data["detail"]


def test_a_10_mb_patch_is_a_413_and_nothing_is_stored(token):
    huge = FIX + "+" + "x" * (10 * 1024 * 1024) + "\n"
    data = _rejected(token, instance(patch=huge), status=413)
    assert data["error"] == "too_large"


def test_a_patch_over_one_mib_in_a_body_django_accepts_is_a_400_naming_the_patch(token):
    big = FIX + "+" + "x" * (1024 * 1024 + 1) + "\n"
    data = _rejected(token, instance(patch=big))
    assert "patch" in data["fields"]


@pytest.mark.parametrize(
    "over",
    [
        {"instance_id": "has space"},
        {"instance_id": "x" * 201},
        {"base_commit": "main"},
        {"image": "two words"},
        {"suites": []},
        {"suites": [{"name": "a"}, {"name": "a"}]},
        {"suites": [{"name": "a", "time_limit_s": 0}]},
        {"suites": [{"name": "a", "time_limit_s": 86_401}]},
        {"conditions": {"time_zone": "Mars/Olympus"}},
        {"conditions": {"hash_seed": "-1"}},
        {"conditions": {"visible_cpus": 0}},
        {"conditions": {"egres": "deny"}},  # a typo is an error, never a default
        {"excluded_test_config": ["../etc/passwd"]},
        {"surprise": 1},
    ],
)
def test_out_of_bounds_fields_are_400s(token, over):
    _rejected(token, instance(**over))


def test_a_second_task_with_the_same_instance_id_is_a_409_and_the_first_is_unchanged(token):
    assert api(token).post("/api/v1/tasks/", instance(), format="json").status_code == 201
    data = _rejected(token, instance(repo="other/repo"), status=409)
    assert data["error"] == "task_exists"
    assert Task.objects.get().repo == "sandman/calc"


def test_anonymous_callers_are_refused():
    response = api(None).post("/api/v1/tasks/", instance(), format="json")
    assert response.status_code == 401
    assert Task.objects.count() == 0


def test_tasks_are_listed_filtered_by_task_set_and_read_by_instance_id(token):
    for n in range(3):
        body = instance(instance_id=f"calc-{n}")
        assert api(token).post("/api/v1/tasks/", body, format="json").status_code == 201
    response = api(token).post(
        "/api/v1/task-sets/", {"name": "small", "tasks": ["calc-0", "calc-2"]}, format="json"
    )
    assert response.status_code == 201, response.content
    set_id = response.json()["id"]
    assert response.json()["tasks"] == ["calc-0", "calc-2"]
    listed = api(token).get("/api/v1/tasks/").json()
    assert listed["count"] == 3
    in_set = api(token).get("/api/v1/tasks/", {"task_set": "small"}).json()
    assert [t["instance_id"] for t in in_set["results"]] == ["calc-0", "calc-2"]
    one = api(token).get("/api/v1/tasks/calc-1/")
    assert one.status_code == 200 and one.json()["instance_id"] == "calc-1"
    group = api(token).get(f"/api/v1/task-sets/{set_id}/").json()
    assert group["name"] == "small" and group["tasks"] == ["calc-0", "calc-2"]
    assert api(token).get("/api/v1/task-sets/").json()["count"] == 1


def test_an_unknown_task_is_a_404(token):
    response = api(token).get("/api/v1/tasks/nope-1/")
    assert response.status_code == 404 and response.json()["error"] == "not_found"


def test_a_task_set_naming_an_unknown_task_is_a_404_and_stores_nothing(token):
    assert api(token).post("/api/v1/tasks/", instance(), format="json").status_code == 201
    before = grading_counts()
    response = api(token).post(
        "/api/v1/task-sets/", {"name": "s", "tasks": ["sandman__calc-1", "nope"]}, format="json"
    )
    assert response.status_code == 404 and "nope" in response.json()["detail"]
    assert grading_counts() == before
    assert not TaskSet.objects.exists()


def test_a_task_set_name_taken_is_a_409(token):
    assert api(token).post("/api/v1/tasks/", instance(), format="json").status_code == 201
    body = {"name": "s", "tasks": ["sandman__calc-1"]}
    assert api(token).post("/api/v1/task-sets/", body, format="json").status_code == 201
    again = api(token).post("/api/v1/task-sets/", body, format="json")
    assert again.status_code == 409 and again.json()["error"] == "task_exists"


def test_the_schema_lists_the_task_routes(token):
    response = api(token).get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    paths = json.loads(response.content)["paths"]
    assert {"get", "post"} <= set(paths["/api/v1/tasks/"])
    assert {"get"} <= set(paths["/api/v1/tasks/{instance_id}/"])
    assert {"get", "post"} <= set(paths["/api/v1/task-sets/"])
    request_ref = paths["/api/v1/tasks/"]["post"]["requestBody"]["content"]["application/json"]
    assert request_ref["schema"]["$ref"].endswith("TaskCreateInput")
