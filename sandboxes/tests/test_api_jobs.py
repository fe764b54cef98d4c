"""REST API for jobs: create, list and get, defaults, ownership, and rejected input.

No controller is needed here: job create and reads go through services and selectors.
Every rejected request is checked to leave every table unchanged.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandboxes.models import Job
from sandboxes.states import SandboxSource
from sandboxes.tests.api_support import api, job_payload, make_job, make_user, row_counts

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice() -> tuple[Any, str]:
    return make_user("alice")


@pytest.fixture
def bob() -> tuple[Any, str]:
    return make_user("bob")


def test_creating_a_job_stores_its_policy_and_answers_201_with_zero_counts(alice):
    user, token = alice
    body = job_payload(
        name="swe-run-7",
        trainer_pod={"name": "trainer-0", "uid": "1234-abcd"},
        pacing={"rate_per_s": 12.5, "burst": 30},
        caps={"max_live": 40, "max_creating": 8},
        warm={"per_key": 2, "idle_timeout_s": 120},
        readiness_budget_s=90,
        max_lifetime_s=600,
        reuse={"enabled": True, "max_uses": 4, "allow_tag_images": True},
    )
    response = api(token).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    job = Job.objects.get(pk=data["id"])
    assert (job.owner_id, job.name, job.egress) == (user.pk, "swe-run-7", "deny")
    assert (job.trainer_pod_name, job.trainer_pod_uid) == ("trainer-0", "1234-abcd")
    assert (job.rate_per_s, job.burst, job.max_live, job.max_creating) == (12.5, 30, 40, 8)
    assert (job.warm_per_key, job.idle_timeout_s) == (2, 120.0)
    assert (job.readiness_budget_s, job.max_lifetime_s) == (90.0, 600.0)
    assert (job.reuse_enabled, job.reuse_max_uses, job.reuse_allow_tags) == (True, 4, True)
    assert data["reuse"] == {"enabled": True, "max_uses": 4, "allow_tag_images": True}
    assert data["pacing"] == {"rate_per_s": 12.5, "burst": 30}
    assert data["caps"] == {"max_live": 40, "max_creating": 8}
    assert data["counts"] == {"live": 0, "warm": 0, "creating": 0}
    assert data["state"] == "active"
    assert data["owner"] == "alice"


def test_an_omitted_policy_takes_the_model_defaults(alice):
    _, token = alice
    response = api(token).post("/api/v1/jobs/", {"name": "j", "egress": "allow"}, format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    for field in (
        "rate_per_s",
        "burst",
        "max_live",
        "max_creating",
        "warm_per_key",
        "idle_timeout_s",
        "readiness_budget_s",
        "max_lifetime_s",
        "reuse_max_uses",
        "reuse_allow_tags",
    ):
        assert getattr(job, field) == Job._meta.get_field(field).default, field
    assert job.trainer_pod_name == "" and job.egress == "allow"
    assert response.json()["trainer_pod"] is None


def test_a_partial_nested_policy_keeps_defaults_for_the_keys_left_out(alice):
    _, token = alice
    response = api(token).post("/api/v1/jobs/", job_payload(caps={"max_live": 10}), format="json")
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.max_live == 10
    assert job.max_creating == Job._meta.get_field("max_creating").default


def test_the_job_list_shows_only_the_callers_jobs_and_staff_see_all(alice, bob):
    a_user, a_token = alice
    b_user, b_token = bob
    a_job = make_job(a_user, name="a-job")
    b_job = make_job(b_user, name="b-job")
    a_ids = [row["id"] for row in api(a_token).get("/api/v1/jobs/").json()["results"]]
    b_ids = [row["id"] for row in api(b_token).get("/api/v1/jobs/").json()["results"]]
    assert a_ids == [a_job.pk]
    assert b_ids == [b_job.pk]
    _, staff_token = make_user("ops", staff=True)
    staff_ids = {row["id"] for row in api(staff_token).get("/api/v1/jobs/").json()["results"]}
    assert staff_ids == {a_job.pk, b_job.pk}


def test_getting_another_users_job_is_a_404_that_looks_like_a_missing_id(alice, bob):
    a_user, _ = alice
    _, b_token = bob
    job = make_job(a_user)
    theirs = api(b_token).get(f"/api/v1/jobs/{job.pk}/")
    missing = api(b_token).get(f"/api/v1/jobs/{job.pk + 1000}/")
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["error"] == missing.json()["error"] == "not_found"
    assert "a-job" not in theirs.content.decode() and job.name not in theirs.content.decode()


def test_the_owner_gets_its_job_with_counts(alice):
    user, token = alice
    job = make_job(user, name="mine")
    response = api(token).get(f"/api/v1/jobs/{job.pk}/")
    assert response.status_code == 200
    assert response.json()["name"] == "mine"
    assert response.json()["counts"] == {"live": 0, "warm": 0, "creating": 0}


@pytest.mark.parametrize(
    "body, field",
    [
        ({"name": "x", "egres": "deny"}, "egres"),  # typo in a top-level key
        ({"name": "x"}, "egress"),  # egress is required
        ({"name": "x", "egress": "sometimes"}, "egress"),
        ({"name": 123, "egress": "deny"}, "name"),  # wrong type
        ({"name": "", "egress": "deny"}, "name"),
        ({"name": "x" * 201, "egress": "deny"}, "name"),
        (job_payload(caps={"max_live": "lots"}), "caps"),
        (job_payload(caps={"max_live": -1}), "caps"),
        (job_payload(caps={"max_live": 5, "max_creatng": 2}), "caps"),  # nested typo
        (job_payload(pacing={"rate_per_s": 0}), "pacing"),
        (job_payload(pacing={"burst": -3}), "pacing"),
        (job_payload(pacing={"burst": True}), "pacing"),
        (job_payload(warm={"per_key": -1}), "warm"),
        (job_payload(reuse={"enabled": True, "max_uses": 9}), "reuse"),
        (job_payload(trainer_pod="trainer-0"), "trainer_pod"),
        (job_payload(trainer_pod={"name": "t"}), "trainer_pod"),
        (job_payload(readiness_budget_s=-5), "readiness_budget_s"),
        (job_payload(max_lifetime_s="forever"), "max_lifetime_s"),
    ],
)
def test_bad_job_input_is_a_400_naming_the_field_and_writes_nothing(alice, body, field):
    _, token = alice
    before = row_counts()
    response = api(token).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    data = response.json()
    assert data["error"] == "invalid"
    assert field in data["detail"]
    assert field in data["fields"]
    assert row_counts() == before


def test_a_warm_target_above_the_live_cap_is_refused_by_the_service_with_a_400(alice):
    _, token = alice
    before = row_counts()
    response = api(token).post(
        "/api/v1/jobs/", job_payload(caps={"max_live": 2}, warm={"per_key": 5}), format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"] == "invalid"
    assert "per_key" in response.json()["detail"]
    assert row_counts() == before


@pytest.mark.parametrize("source", [*SandboxSource.values, SandboxSource.WARM])
def test_the_acquire_answer_body_is_the_output_serializers_to_the_type(source):
    """``acquire_body`` builds the hot route's answer without a serializer instance; the
    serializer is the schema, so the two must agree on every field and its type."""
    from sandboxes.apis.jobs import JobAcquireApi, acquire_body
    from sandboxes.controller.runtime import AcquireResult

    result = AcquireResult(
        sandbox_id=7,
        name="sm-1-abc",
        address="10.0.0.7:8123",
        token="t0ken",
        source=source,
        wait_ms=3,  # an int where a float is declared: both give 3.0
        queue_ms=0.25,
    )

    expected = dict(JobAcquireApi.OutputSerializer(result).data)
    body = acquire_body(result)
    assert body == expected
    assert {k: type(v) for k, v in body.items()} == {k: type(v) for k, v in expected.items()}
