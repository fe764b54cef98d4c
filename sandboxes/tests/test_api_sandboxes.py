"""REST reads of sandboxes: ownership (404 for others), filters, pagination, no tokens.

Sandboxes are written through the real services (``api_support.seed_sandbox``); no
controller runs, so every answer here comes from the selectors and serializers alone.
"""

from __future__ import annotations

from typing import Any

import pytest

from sandboxes.models import Job
from sandboxes.tests.api_support import api, make_job, make_user, row_counts, seed_sandbox

pytestmark = pytest.mark.django_db

SPEC = {"cpu": "1", "memory": "1Gi"}


@pytest.fixture
def two_users() -> dict[str, Any]:
    a_user, a_token = make_user("alice")
    b_user, b_token = make_user("bob")
    a_job = make_job(a_user, name="alice-job")
    a_box = seed_sandbox(a_job, hand_out=True)
    return {
        "a_token": a_token,
        "b_token": b_token,
        "a_job": a_job,
        "a_box": a_box,
        "b_user": b_user,
    }


def test_another_user_gets_404_for_the_job_its_acquire_prewarm_drain_and_sandboxes(two_users):
    b = api(two_users["b_token"])
    job, box = two_users["a_job"], two_users["a_box"]
    before = row_counts()
    answers = [
        b.get(f"/api/v1/jobs/{job.pk}/"),
        b.post(
            f"/api/v1/jobs/{job.pk}/acquire/",
            {"image": "sandman/empty", "spec": SPEC},
            format="json",
        ),
        b.post(
            f"/api/v1/jobs/{job.pk}/prewarm/",
            {"keys": [{"image": "sandman/empty", "spec": SPEC, "count": 1}]},
            format="json",
        ),
        b.post(f"/api/v1/jobs/{job.pk}/drain/", {}, format="json"),
        b.get(f"/api/v1/sandboxes/{box.pk}/"),
        b.post(f"/api/v1/sandboxes/{box.pk}/release/", {}, format="json"),
    ]
    for response in answers:
        assert response.status_code == 404, (response.request["PATH_INFO"], response.content)
        assert response.json()["error"] == "not_found"
        assert box.name not in response.content.decode()
    assert row_counts() == before
    box.refresh_from_db()
    assert box.state == "in_use"
    assert Job.objects.get(pk=job.pk).state == "active"


def test_another_user_never_sees_the_owners_sandboxes_in_the_list(two_users):
    b = api(two_users["b_token"])
    job = two_users["a_job"]
    assert b.get("/api/v1/sandboxes/").json()["count"] == 0
    assert b.get(f"/api/v1/sandboxes/?job={job.pk}").json()["results"] == []
    mine = api(two_users["a_token"]).get("/api/v1/sandboxes/").json()
    assert [row["id"] for row in mine["results"]] == [two_users["a_box"].pk]


def test_staff_see_every_users_sandboxes():
    _, staff_token = make_user("ops", staff=True)
    a_user, _ = make_user("alice")
    box = seed_sandbox(make_job(a_user))
    listing = api(staff_token).get("/api/v1/sandboxes/").json()
    assert [row["id"] for row in listing["results"]] == [box.pk]
    assert api(staff_token).get(f"/api/v1/sandboxes/{box.pk}/").status_code == 200


def test_no_list_or_detail_answer_contains_a_sandbox_token(two_users):
    a = api(two_users["a_token"])
    box = two_users["a_box"]
    assert len(box.token) >= 32
    responses = [
        a.get("/api/v1/sandboxes/"),
        a.get(f"/api/v1/sandboxes/{box.pk}/"),
        a.get(f"/api/v1/sandboxes/?job={two_users['a_job'].pk}&state=in_use"),
        a.get(f"/api/v1/jobs/{two_users['a_job'].pk}/"),
        a.get("/api/v1/jobs/"),
    ]
    for response in responses:
        assert response.status_code == 200
        assert box.token not in response.content.decode()
        assert '"token"' not in response.content.decode()


def test_the_detail_carries_spec_timestamps_and_the_event_timeline_in_order(two_users):
    a = api(two_users["a_token"])
    box = two_users["a_box"]
    data = a.get(f"/api/v1/sandboxes/{box.pk}/").json()
    assert data["spec"] == {"cpu": "1", "memory": "1Gi", "workspace": None}
    assert data["state"] == "in_use" and data["source"] == "created"
    assert data["ready_at"] and data["acquired_at"]
    kinds = [event["kind"] for event in data["events"]]
    assert kinds.index("ready") < kinds.index("acquired")
    times = [event["at"] for event in data["events"]]
    assert times == sorted(times)
    states = [e["detail"].get("to") for e in data["events"] if e["kind"] == "state"]
    assert states == ["requested", "creating", "ready", "in_use"]


def test_the_list_filters_by_job_state_and_role_and_paginates():
    user, token = make_user("carol")
    job1, job2 = make_job(user, name="one"), make_job(user, name="two")
    ready = seed_sandbox(job1)
    in_use = seed_sandbox(job1, hand_out=True)
    grading = seed_sandbox(job2, role="grading")
    requested = seed_sandbox(job2, ready_after_s=None)
    a = api(token)

    def ids(query: str) -> set[int]:
        return {row["id"] for row in a.get(f"/api/v1/sandboxes/{query}").json()["results"]}

    assert ids(f"?job={job1.pk}") == {ready.pk, in_use.pk}
    assert ids("?state=ready") == {ready.pk, grading.pk}
    assert ids("?role=grading") == {grading.pk}
    assert ids(f"?job={job2.pk}&state=requested") == {requested.pk}
    page = a.get("/api/v1/sandboxes/?limit=2").json()
    assert page["count"] == 4 and len(page["results"]) == 2 and page["next"]
    rest = a.get("/api/v1/sandboxes/?limit=2&offset=2").json()
    seen = {r["id"] for r in page["results"]} | {r["id"] for r in rest["results"]}
    assert seen == {ready.pk, in_use.pk, grading.pk, requested.pk}


def test_job_counts_reflect_live_warm_and_creating_sandboxes():
    user, token = make_user("dave")
    job = make_job(user)
    seed_sandbox(job)  # ready → warm
    seed_sandbox(job, hand_out=True)  # in use
    seed_sandbox(job, ready_after_s=None)  # requested → creating
    counts = api(token).get(f"/api/v1/jobs/{job.pk}/").json()["counts"]
    assert counts == {"live": 3, "warm": 1, "creating": 1}
    listed = api(token).get("/api/v1/jobs/").json()["results"][0]["counts"]
    assert listed == counts
