"""REST ingest of trajectories and learner steps (issue 11 item 1, Appendix J's records).

Real endpoints on PostgreSQL; sandboxes and acquisitions that Sandman recorded are written
through the real services. Every refused batch is checked to leave every table unchanged.
"""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import pytest

from sandboxes.models import LearnerStep, Trajectory, TrajectoryPhase
from sandboxes.services.acquisitions import acquisition_record
from sandboxes.tests.api_support import api, make_job, make_user, seed_sandbox

pytestmark = pytest.mark.django_db

T0 = 1_780_000_000.0


def trajectory(tid: str = "t1", **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": tid,
        "slot": 0,
        "group": "g1",
        "start": T0,
        "end": T0 + 100,
        "failed": False,
        "sandbox_ids": [],
        "phases": [
            {"kind": "rollout_acquisition", "start": T0, "end": T0 + 5},
            {"kind": "generation", "start": T0 + 5, "end": T0 + 80},
            {"kind": "tests", "start": T0 + 80, "end": T0 + 100},
        ],
    }
    body.update(over)
    return body


def learner_step(n: int = 1, **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "step": n,
        "wait_start": T0 + 50,
        "wait_end": T0 + 100,
        "handover_end": T0 + 102,
        "train_end": T0 + 130,
        "groups": ["g1"],
    }
    body.update(over)
    return body


def tables() -> tuple[int, int, int]:
    return Trajectory.objects.count(), TrajectoryPhase.objects.count(), LearnerStep.objects.count()


@pytest.fixture
def owner() -> tuple[Any, str, int]:
    user, token = make_user("alice")
    return user, token, make_job(user).pk


def post(token: str, job_id: int, route: str, body: Any) -> Any:
    return api(token).post(f"/api/v1/jobs/{job_id}/{route}/", body, format="json")


def test_a_batch_of_trajectories_is_stored_with_its_phases(owner):
    _, token, job_id = owner
    batch = [trajectory("a"), trajectory("b", slot=1, failed=True, phases=[])]
    batch.append(trajectory("c", slot=1, predecessor="b", start=T0 + 100, end=T0 + 200, phases=[]))
    response = post(token, job_id, "trajectories", {"trajectories": batch})
    assert response.status_code == 200, response.content
    assert response.json() == {"received": 3, "stored": 3, "duplicates": 0}
    a = Trajectory.objects.get(job_id=job_id, trainer_id="a")
    assert (a.slot, a.group, a.start, a.end, a.failed) == (0, "g1", T0, T0 + 100, False)
    kinds = list(a.phases.order_by("start").values_list("kind", "start", "end", "from_sandman"))
    assert kinds == [
        ("rollout_acquisition", T0, T0 + 5, False),
        ("generation", T0 + 5, T0 + 80, False),
        ("tests", T0 + 80, T0 + 100, False),
    ]
    assert Trajectory.objects.get(trainer_id="c").predecessor == "b"


def test_a_repeated_trajectory_id_updates_nothing_and_is_counted_as_a_duplicate(owner):
    _, token, job_id = owner
    assert post(token, job_id, "trajectories", {"trajectories": [trajectory("a")]}).json() == {
        "received": 1,
        "stored": 1,
        "duplicates": 0,
    }
    changed = trajectory("a", slot=7, end=T0 + 150)
    batch = [changed, trajectory("b"), trajectory("b", slot=3)]
    response = post(token, job_id, "trajectories", {"trajectories": batch})
    assert response.status_code == 200
    assert response.json() == {"received": 3, "stored": 1, "duplicates": 2}
    a = Trajectory.objects.get(trainer_id="a")
    assert (a.slot, a.end) == (0, T0 + 100)
    assert Trajectory.objects.get(trainer_id="b").slot == 0  # the first of the batch won
    assert TrajectoryPhase.objects.count() == 6


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        ({"end": T0 - 1}, "end is before start"),
        ({"phases": [{"kind": "lunch", "start": T0, "end": T0 + 1}]}, "kind"),
        ({"phases": [{"kind": "tests", "start": T0 + 90, "end": T0 + 101}]}, "outside"),
        ({"phases": [{"kind": "tests", "start": T0 + 9, "end": T0 + 8}]}, "ends before"),
        ({"slot": -1}, "slot"),
        ({"start": 1e12}, "start"),
        ({"id": "x" * 201}, "id"),
        ({"sandbox_ids": ["one"]}, "sandbox_ids"),
        ({"colour": "red"}, "colour"),
        ({"predecessor": "t1"}, "own predecessor"),
    ],
)
def test_a_bad_trajectory_is_refused_with_its_index_and_nothing_is_stored(owner, bad, words):
    _, token, job_id = owner
    batch = [trajectory("t0"), trajectory("t1", **bad), trajectory("t2")]
    response = post(token, job_id, "trajectories", {"trajectories": batch})
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"] == "invalid"
    assert body["extra"]["index"] == 1
    assert words in body["detail"]
    assert tables() == (0, 0, 0)


def test_sandmans_own_acquisition_times_win_over_the_trainers_by_sandbox_id(owner):
    user, token, job_id = owner
    from sandboxes.models import Job

    job = Job.objects.get(pk=job_id)
    rollout = seed_sandbox(job, role="rollout")
    grading = seed_sandbox(job, role="grading")
    at = dt.datetime.fromtimestamp(T0, tz=dt.UTC)
    for sandbox, start_s, end_s in ((rollout, 1.0, 3.5), (grading, 82.0, 86.0)):
        acquisition_record(
            job_id=job_id,
            role=sandbox.role,
            image="sandman/empty",
            key_hash="k",
            outcome="ok",
            sandbox_id=sandbox.pk,
            started_at=at + dt.timedelta(seconds=start_s),
            now=at + dt.timedelta(seconds=end_s),
        )
    phases = [
        {"kind": "rollout_acquisition", "start": T0, "end": T0 + 5},
        {"kind": "generation", "start": T0 + 5, "end": T0 + 80},
        {"kind": "grading_acquisition", "start": T0 + 80, "end": T0 + 90},
        {"kind": "tests", "start": T0 + 90, "end": T0 + 100},
    ]
    record = trajectory("a", sandbox_ids=[rollout.pk, grading.pk], phases=phases)
    assert post(token, job_id, "trajectories", {"trajectories": [record]}).status_code == 200
    stored = dict(
        (kind, (round(start - T0, 3), round(end - T0, 3), mine))
        for kind, start, end, mine in TrajectoryPhase.objects.values_list(
            "kind", "start", "end", "from_sandman"
        )
    )
    assert stored == {
        "rollout_acquisition": (1.0, 3.5, True),
        "generation": (5.0, 80.0, False),
        "grading_acquisition": (82.0, 86.0, True),
        "tests": (90.0, 100.0, False),
    }


def test_another_owners_job_is_404_and_stores_nothing(owner):
    _, _, job_id = owner
    _, bob = make_user("bob")
    assert post(bob, job_id, "trajectories", {"trajectories": [trajectory()]}).status_code == 404
    assert post(bob, job_id, "learner-steps", {"steps": [learner_step()]}).status_code == 404
    assert post(bob, 999_999, "learner-steps", {"steps": [learner_step()]}).status_code == 404
    assert tables() == (0, 0, 0)


def test_learner_steps_are_stored_and_a_repeated_step_is_a_duplicate(owner):
    _, token, job_id = owner
    batch = [learner_step(1), learner_step(2, dropped_groups=["g9"], handover_end=None)]
    response = post(token, job_id, "learner-steps", {"steps": batch})
    assert response.json() == {"received": 2, "stored": 2, "duplicates": 0}
    again = post(token, job_id, "learner-steps", {"steps": [learner_step(2, train_end=T0 + 999)]})
    assert again.json() == {"received": 1, "stored": 0, "duplicates": 1}
    two = LearnerStep.objects.get(job_id=job_id, step=2)
    assert (two.train_end, two.groups, two.dropped_groups, two.handover_end) == (
        T0 + 130,
        ["g1"],
        ["g9"],
        None,
    )


@pytest.mark.parametrize(
    "bad",
    [
        {"wait_end": T0 + 40},
        {"train_end": T0 + 90},
        {"handover_end": T0 + 140},
        {"groups": []},
        {"step": -1},
    ],
)
def test_a_bad_learner_step_is_refused_with_its_index_and_nothing_is_stored(owner, bad):
    _, token, job_id = owner
    batch = [learner_step(1), learner_step(2), learner_step(3, **bad)]
    response = post(token, job_id, "learner-steps", {"steps": batch})
    assert response.status_code == 400, response.content
    assert response.json()["extra"]["index"] == 2
    assert tables() == (0, 0, 0)


def test_ten_thousand_records_are_taken_in_one_call_and_one_more_is_refused(owner):
    _, token, job_id = owner
    steps = [learner_step(n) for n in range(10_001)]
    refused = post(token, job_id, "learner-steps", {"steps": steps})
    assert refused.status_code == 400
    assert LearnerStep.objects.count() == 0
    taken = post(token, job_id, "learner-steps", {"steps": steps[:10_000]})
    assert taken.json() == {"received": 10_000, "stored": 10_000, "duplicates": 0}


@pytest.mark.parametrize("body", [[], {}, {"trajectories": []}, {"trajectories": "x"}, "x"])
def test_malformed_bodies_are_a_400_not_a_5xx(owner, body):
    _, token, job_id = owner
    response = post(token, job_id, "trajectories", body)
    assert response.status_code == 400, response.content
    raw = api(token).post(
        f"/api/v1/jobs/{job_id}/learner-steps/", b"{", content_type="application/json"
    )
    assert raw.status_code == 400


def test_the_schema_declares_both_ingest_routes_with_their_bodies(owner):
    _, token, _ = owner
    response = api(token).get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    schema = json.loads(response.content)
    components = schema["components"]["schemas"]
    for path, key in (("trajectories", "trajectories"), ("learner-steps", "steps")):
        op = schema["paths"][f"/api/v1/jobs/{{job_id}}/{path}/"]["post"]
        ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert key in components[ref.rsplit("/", 1)[1]]["properties"]
        assert "200" in op["responses"]
