"""Every error of the REST API is JSON ``{"error", "detail"}`` with a 4xx, and changes nothing.

Covers the transport-level failures (auth, malformed JSON, wrong media type, wrong
method, unknown paths and ids) and the validation of acquire, prewarm and release
bodies, which is decided before the controller is asked anything.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client as DjangoClient

from sandboxes.tests.api_support import api, make_job, make_user, row_counts, seed_sandbox

pytestmark = pytest.mark.django_db

SPEC = {"cpu": "1", "memory": "1Gi"}


@pytest.fixture
def alice() -> tuple[Any, str]:
    return make_user("alice")


def _assert_json_error(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    data = response.json()
    assert data["error"] == code
    assert isinstance(data["detail"], str) and data["detail"]
    return data


def test_a_request_without_credentials_is_a_401_json_error():
    _assert_json_error(api(None).get("/api/v1/jobs/"), 401, "not_authenticated")


def test_a_request_with_an_unknown_token_is_a_401_json_error():
    _assert_json_error(api("0" * 40).get("/api/v1/jobs/"), 401, "authentication_failed")


def test_malformed_json_is_a_400_json_error_and_writes_nothing(alice):
    _, token = alice
    before = row_counts()
    response = api(token).post(
        "/api/v1/jobs/", data='{"name": "x", "egress": ', content_type="application/json"
    )
    _assert_json_error(response, 400, "malformed_json")
    assert row_counts() == before


@pytest.mark.parametrize(
    "content_type", ["text/plain", "application/x-www-form-urlencoded", "application/xml"]
)
def test_a_body_that_is_not_json_is_a_415_json_error(alice, content_type):
    _, token = alice
    before = row_counts()
    response = api(token).post(
        "/api/v1/jobs/", data="name=x&egress=deny", content_type=content_type
    )
    _assert_json_error(response, 415, "unsupported_media_type")
    assert row_counts() == before


def test_a_json_array_instead_of_an_object_is_a_400(alice):
    _, token = alice
    before = row_counts()
    response = api(token).post("/api/v1/jobs/", [1, 2], format="json")
    _assert_json_error(response, 400, "invalid")
    assert row_counts() == before


def test_a_wrong_method_is_a_405_json_error(alice):
    user, token = alice
    job = make_job(user)
    _assert_json_error(
        api(token).put(f"/api/v1/jobs/{job.pk}/", {}, format="json"), 405, "method_not_allowed"
    )
    _assert_json_error(api(token).get(f"/api/v1/jobs/{job.pk}/acquire/"), 405, "method_not_allowed")
    _assert_json_error(
        api(token).put("/api/v1/jobs/", {}, format="json"), 405, "method_not_allowed"
    )


def test_an_unknown_path_is_a_404_json_error(alice):
    _, token = alice
    response = DjangoClient().get("/api/v1/no-such-thing/", HTTP_AUTHORIZATION=f"Token {token}")
    _assert_json_error(response, 404, "not_found")


@pytest.mark.parametrize(
    "method, path",
    [
        ("get", "/api/v1/jobs/999999/"),
        ("post", "/api/v1/jobs/999999/acquire/"),
        ("post", "/api/v1/jobs/999999/prewarm/"),
        ("post", "/api/v1/jobs/999999/drain/"),
        ("get", "/api/v1/sandboxes/999999/"),
        ("post", "/api/v1/sandboxes/999999/release/"),
    ],
)
def test_an_unknown_id_is_a_404_json_error_and_writes_nothing(alice, method, path):
    _, token = alice
    before = row_counts()
    body = {"image": "sandman/empty", "spec": SPEC} if path.endswith("acquire/") else {}
    response = getattr(api(token), method)(path, body, format="json")
    _assert_json_error(response, 404, "not_found")
    assert row_counts() == before


@pytest.mark.parametrize(
    "body, field",
    [
        ({"image": "sandman/empty", "spec": {"cpu": "2 cores", "memory": "1Gi"}}, "cpu"),
        ({"image": "sandman/empty", "spec": {"cpu": "-1", "memory": "1Gi"}}, "cpu"),
        ({"image": "sandman/empty", "spec": {"cpu": "0", "memory": "1Gi"}}, "cpu"),
        ({"image": "sandman/empty", "spec": {"cpu": "1", "memory": "8Gx"}}, "memory"),
        (
            {"image": "sandman/empty", "spec": {"cpu": "1", "memory": "1Gi", "workspace": "lots"}},
            "workspace",
        ),
        ({"image": "sandman/empty", "spec": {"cpu": "1", "memory": "1Gi", "gpu": 1}}, "gpu"),
        ({"image": "sandman/empty", "spec": {"cpu": "1"}}, "memory"),
        ({"image": "sandman/empty"}, "spec"),
        ({"image": "sandman/empty", "spec": "2 cpu 8Gi"}, "spec"),
        ({"spec": SPEC}, "image"),
        ({"image": 7, "spec": SPEC}, "image"),
        ({"image": "sandman/empty", "spec": SPEC, "role": "admin"}, "role"),
        ({"image": "sandman/empty", "spec": SPEC, "timeout_s": -1}, "timeout_s"),
        ({"image": "sandman/empty", "spec": SPEC, "timeout_s": "soon"}, "timeout_s"),
        ({"image": "sandman/empty", "spec": SPEC, "imagee": "x"}, "imagee"),
    ],
)
def test_bad_acquire_input_is_a_400_naming_the_field_and_writes_nothing(alice, body, field):
    user, token = alice
    job = make_job(user)
    before = row_counts()
    response = api(token).post(f"/api/v1/jobs/{job.pk}/acquire/", body, format="json")
    data = _assert_json_error(response, 400, "invalid")
    assert field in data["detail"]
    assert row_counts() == before


@pytest.mark.parametrize(
    "body, field",
    [
        ({"keys": []}, "keys"),
        ({}, "keys"),
        ({"keys": [{"image": "sandman/empty", "spec": SPEC, "count": -1}]}, "count"),
        ({"keys": [{"image": "sandman/empty", "spec": SPEC, "count": 0}]}, "count"),
        ({"keys": [{"image": "sandman/empty", "spec": SPEC, "count": "three"}]}, "count"),
        ({"keys": [{"image": "sandman/empty", "count": 2}]}, "spec"),
        (
            {
                "keys": [
                    {"image": "sandman/empty", "spec": {"cpu": "8Gx", "memory": "1Gi"}, "count": 1}
                ]
            },
            "cpu",
        ),
        ({"keys": [{"image": "sandman/empty", "spec": SPEC, "count": 1, "cnt": 2}]}, "cnt"),
        ({"keys": {"image": "sandman/empty"}}, "keys"),
    ],
)
def test_bad_prewarm_input_is_a_400_and_writes_nothing(alice, body, field):
    user, token = alice
    job = make_job(user)
    before = row_counts()
    response = api(token).post(f"/api/v1/jobs/{job.pk}/prewarm/", body, format="json")
    data = _assert_json_error(response, 400, "invalid")
    assert field in data["detail"]
    assert row_counts() == before


@pytest.mark.parametrize(
    "body, field",
    [
        ({"outcome": {"verdict": "maybe"}}, "verdict"),
        ({"outcome": {"verdict": "pass", "patch_sha256": "xyz"}}, "patch_sha256"),
        ({"outcome": {"patch_sha256": "a" * 64}}, "verdict"),
        ({"outcome": "pass"}, "outcome"),
        ({"verdict": "pass"}, "verdict"),  # outcome fields at the top level: a typo
    ],
)
def test_bad_release_input_is_a_400_and_leaves_the_sandbox_as_it_was(alice, body, field):
    user, token = alice
    sandbox = seed_sandbox(make_job(user), hand_out=True)
    before = row_counts()
    response = api(token).post(f"/api/v1/sandboxes/{sandbox.pk}/release/", body, format="json")
    data = _assert_json_error(response, 400, "invalid")
    assert field in data["detail"]
    assert row_counts() == before
    sandbox.refresh_from_db()
    assert sandbox.state == "in_use" and sandbox.released_at is None


def test_bad_sandbox_list_filters_are_a_400(alice):
    _, token = alice
    _assert_json_error(api(token).get("/api/v1/sandboxes/?state=sleepy"), 400, "invalid")
    _assert_json_error(api(token).get("/api/v1/sandboxes/?job=abc"), 400, "invalid")
    _assert_json_error(api(token).get("/api/v1/sandboxes/?role=boss"), 400, "invalid")


def test_an_unknown_image_is_refused_with_400_before_anything_is_queued(alice):
    user, token = alice
    job = make_job(user)
    before = row_counts()
    acquire = api(token).post(
        f"/api/v1/jobs/{job.pk}/acquire/", {"image": "no/such-image", "spec": SPEC}, format="json"
    )
    _assert_json_error(acquire, 400, "unknown_image")
    prewarm = api(token).post(
        f"/api/v1/jobs/{job.pk}/prewarm/",
        {"keys": [{"image": "no/such-image", "spec": SPEC, "count": 2}]},
        format="json",
    )
    _assert_json_error(prewarm, 400, "unknown_image")
    assert row_counts() == before
