"""The async hot routes (acquire, release): same contract, no query for a known caller.

``sandboxes.apis.access`` answers "who is this token" and "whose job is this" from memory
after the first request; these tests pin what that must never change: a revoked token or
a deactivated user is refused at once, another user's job stays a 404, session logins
still work, and a repeated acquire/release costs the request no database query.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from sandboxes.tests.api_support import api, make_job, make_user, seed_sandbox

SPEC = {"cpu": "500m", "memory": "256Mi"}
BAD_BODY = {"image": "sandman/empty", "spec": {"cpu": "lots", "memory": "1Gi"}}


@pytest.fixture(autouse=True)
def token_known_across_a_create(settings):
    """A token read once stays known while a sandbox is created on a loaded machine,
    longer than the 1 s revocation window (tested in ``test_api_access``)."""
    settings.SANDMAN_API_TOKEN_TTL_S = 600.0


def _acquire(client: APIClient, job_id: int, body: dict[str, Any]):
    return client.post(f"/api/v1/jobs/{job_id}/acquire/", body, format="json")


@pytest.mark.django_db
def test_a_deleted_token_is_refused_at_once_though_it_was_just_used():
    user, token = make_user("alice")
    job = make_job(user)
    assert _acquire(api(token), job.pk, BAD_BODY).status_code == 400  # known and cached
    Token.objects.filter(key=token).delete()
    response = _acquire(api(token), job.pk, BAD_BODY)
    assert response.status_code == 401
    assert response.json()["error"] == "authentication_failed"


@pytest.mark.django_db
def test_a_deactivated_user_is_refused_at_once_on_acquire_and_release():
    user, token = make_user("alice")
    box = seed_sandbox(make_job(user), hand_out=True)
    release = f"/api/v1/sandboxes/{box.pk}/release/"
    assert api(token).post(release, {"outcome": "pass"}, format="json").status_code == 400
    user.is_active = False
    user.save(update_fields=["is_active"])
    response = api(token).post(release, {"outcome": "pass"}, format="json")
    assert response.status_code == 401
    assert response.json()["error"] == "authentication_failed"
    box.refresh_from_db()
    assert box.state == "in_use"


@pytest.mark.django_db
def test_another_users_job_stays_a_404_after_its_owner_used_it():
    alice, a_token = make_user("alice")
    _, b_token = make_user("bob")
    job = make_job(alice)
    assert _acquire(api(a_token), job.pk, BAD_BODY).status_code == 400  # owner known now
    for body in (BAD_BODY, {"image": "sandman/empty", "spec": SPEC}):
        response = _acquire(api(b_token), job.pk, body)
        assert response.status_code == 404, response.content
        assert response.json() == {"error": "not_found", "detail": f"No job {job.pk}."}


@pytest.mark.django_db
def test_staff_may_use_any_job_and_a_session_login_authenticates_the_hot_routes():
    alice, _ = make_user("alice")
    staff, _ = make_user("root", staff=True)
    job = make_job(alice)
    client = APIClient()
    anonymous = _acquire(client, job.pk, BAD_BODY)
    assert anonymous.status_code == 401 and anonymous.json()["error"] == "not_authenticated"
    client.force_login(staff)
    answer = _acquire(client, job.pk, BAD_BODY)  # past auth and ownership: the body is judged
    assert answer.status_code == 400 and answer.json()["error"] == "invalid"


@pytest.mark.django_db
def test_malformed_token_headers_get_drfs_own_401_sentences():
    user, token = make_user("alice")
    job = make_job(user)
    for header, words in (("Token", "No credentials"), (f"Token {token} extra", "spaces")):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        response = _acquire(client, job.pk, BAD_BODY)
        assert response.status_code == 401, header
        assert words in response.json()["detail"]


@pytest.mark.django_db(transaction=True)
def test_a_repeated_acquire_and_its_release_cost_the_request_no_database_query(controller):
    user, token = make_user("trainer")
    client = api(token)
    created = client.post("/api/v1/jobs/", {"name": "hot", "egress": "allow"}, format="json")
    job_id = created.json()["id"]
    body = {"image": "sandman/empty", "spec": SPEC, "timeout_s": 60}
    first = _acquire(client, job_id, body)
    assert first.status_code == 200, first.content
    assert (
        client.post(f"/api/v1/sandboxes/{first.json()['sandbox_id']}/release/").status_code == 200
    )
    with CaptureQueriesContext(connection) as acquire_queries:
        second = _acquire(client, job_id, body)
    assert second.status_code == 200, second.content
    sandbox_id = second.json()["sandbox_id"]
    with CaptureQueriesContext(connection) as release_queries:
        released = client.post(f"/api/v1/sandboxes/{sandbox_id}/release/", {}, format="json")
    assert released.status_code == 200 and released.json() == {
        "sandbox_id": sandbox_id,
        "released": True,
    }
    # The controller writes on its own threads; the request itself read nothing.
    assert [q["sql"] for q in acquire_queries.captured_queries] == []
    assert [q["sql"] for q in release_queries.captured_queries] == []
    second_again = client.post(f"/api/v1/sandboxes/{sandbox_id}/release/", {}, format="json")
    assert second_again.status_code == 409  # the controller still judges the state
