"""GET /api/v1/jobs/{id}/critical-path/: Appendix J's shares, waiting share and Little's law.

Records go in through the real ingest routes; the hand-computable example is the one of
``test_critical_path.py`` (shares 40% learner, 30% generation, 10% commands, 8% tests,
6% grading acquisition, 4% other, 2% release).
"""

from __future__ import annotations

from typing import Any

import pytest

from sandboxes.critical_path import CATEGORIES, LITTLE_CAVEAT
from sandboxes.tests.api_support import api, make_job, make_user

pytestmark = pytest.mark.django_db

T0 = 1_780_000_000.0


def phases(*items: tuple[str, float, float]) -> list[dict[str, Any]]:
    return [{"kind": k, "start": T0 + a, "end": T0 + b} for k, a, b in items]


A = {
    "id": "a",
    "slot": 0,
    "group": "g1",
    "start": T0 + 20,
    "end": T0 + 150,
    "failed": False,
    "phases": phases(("rollout_acquisition", 20, 30), ("generation", 30, 150)),
}
B = {
    "id": "b",
    "slot": 1,
    "group": "g1",
    "start": T0 + 40,
    "end": T0 + 158,
    "failed": False,
    "phases": phases(
        ("rollout_acquisition", 40, 45),
        ("generation", 45, 130),
        ("commands", 130, 140),
        ("grading_acquisition", 142, 148),
        ("tests", 148, 156),
        ("release", 156, 158),
    ),
}
STEP = {"step": 1, "wait_start": T0 + 100, "wait_end": T0 + 160, "train_end": T0 + 200}


@pytest.fixture
def owner() -> tuple[str, int]:
    user, token = make_user("alice")
    job_id = make_job(user).pk
    client = api(token)
    url = f"/api/v1/jobs/{job_id}"
    assert (
        client.post(f"{url}/trajectories/", {"trajectories": [A, B]}, format="json").status_code
        == 200
    )
    steps = [{**STEP, "groups": ["g1"]}]
    assert client.post(f"{url}/learner-steps/", {"steps": steps}, format="json").status_code == 200
    return token, job_id


def get(token: str, job_id: int, **query: Any) -> Any:
    return api(token).get(f"/api/v1/jobs/{job_id}/critical-path/", query)


def test_the_hand_computable_example_answers_its_shares_waiting_share_and_estimate(owner):
    token, job_id = owner
    response = get(token, job_id)
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body["shares"]) == set(CATEGORIES)
    expected = {
        "learner": 0.40,
        "generation": 0.30,
        "commands": 0.10,
        "tests": 0.08,
        "grading_acquisition": 0.06,
        "other": 0.04,
        "release": 0.02,
    }
    for category in CATEGORIES:
        assert body["shares"][category] == pytest.approx(expected.get(category, 0.0), abs=1e-9)
    assert body["unresolved_share"] == 0.0
    (step,) = body["per_step"]
    assert (step["step"], step["ended_by"], step["interval_s"]) == (1, "b", 100.0)
    assert sum(step["seconds"].values()) == pytest.approx(100.0, abs=1e-6)
    # In the span [100, 200]: a 50 s + b 58 s of trajectory time, of which 6 s acquisition.
    assert body["waiting_share"] == pytest.approx(6 / 108)
    estimate = body["estimate"]
    assert estimate["trajectories_per_step"] == 2
    assert estimate["mean_trajectory_s"] == pytest.approx((130 + 118) / 2)
    assert estimate["mean_in_flight"] == pytest.approx(1.08)
    assert estimate["estimated_interval_s"] == pytest.approx(2 * 124 / 1.08)
    assert estimate["measured_interval_s"] == pytest.approx(100.0)
    assert estimate["f"] == pytest.approx((10 + 5 + 6) / 248)
    assert estimate["estimated_reduction"] == estimate["f"]
    assert estimate["caveat"] == LITTLE_CAVEAT
    assert "not a measurement" in estimate["caveat"]


def test_from_and_to_select_the_steps_whose_interval_lies_inside(owner):
    token, job_id = owner
    assert get(token, job_id, **{"from": T0 + 100, "to": T0 + 200}).json()["steps"] == 1
    empty = get(token, job_id, **{"from": T0 + 101}).json()
    assert (empty["steps"], empty["per_step"], empty["waiting_share"]) == (0, [], None)
    assert empty["shares"] == dict.fromkeys(CATEGORIES, 0.0)
    assert empty["estimate"] is None
    assert get(token, job_id, to=T0 + 199).json()["steps"] == 0


@pytest.mark.parametrize(
    "query", [{"from": "soon"}, {"from": T0 + 5, "to": T0}, {"to": -1}, {"colour": "red"}]
)
def test_a_bad_range_is_a_400(owner, query):
    token, job_id = owner
    response = get(token, job_id, **query)
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "invalid"


def test_another_owners_job_is_a_404(owner):
    _, job_id = owner
    _, bob = make_user("bob")
    assert get(bob, job_id).status_code == 404


def test_a_failed_predecessor_in_the_database_is_loaded_and_charged_to_failure_retry():
    user, token = make_user("carol")
    job_id = make_job(user).pk
    client = api(token)
    failed = {"id": "f", "slot": 2, "group": "g", "start": T0, "end": T0 + 30, "failed": True}
    retry = {
        "id": "r",
        "slot": 2,
        "group": "g",
        "start": T0 + 30,
        "end": T0 + 60,
        "failed": False,
        "predecessor": "f",
        "phases": phases(("tests", 30, 60)),
    }
    earlier = {**failed, "id": "e", "group": "old", "failed": False, "end": T0 + 5}
    batch = [{"phases": [], **failed}, retry, {"phases": [], **earlier}]
    assert (
        client.post(
            f"/api/v1/jobs/{job_id}/trajectories/", {"trajectories": batch}, format="json"
        ).status_code
        == 200
    )
    step = {"step": 7, "wait_start": T0 + 10, "wait_end": T0 + 60, "train_end": T0 + 70}
    assert client.post(
        f"/api/v1/jobs/{job_id}/learner-steps/",
        {"steps": [{**step, "groups": ["g"]}]},
        format="json",
    ).json() == {"received": 1, "stored": 1, "duplicates": 0}
    (per_step,) = get(token, job_id).json()["per_step"]
    assert {k: v for k, v in per_step["seconds"].items() if v} == {
        "tests": 30.0,
        "failure_retry": 20.0,
        "learner": 10.0,
    }


def test_the_schema_declares_the_critical_path_route(owner):
    token, _ = owner
    schema = api(token).get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    op = schema.json()["paths"]["/api/v1/jobs/{job_id}/critical-path/"]["get"]
    assert {p["name"] for p in op["parameters"]} >= {"from", "to"}
