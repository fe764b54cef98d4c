"""The OpenAPI document lists every trainer path with its bodies; /healthz answers."""

from __future__ import annotations

import json

import pytest

from sandboxes.tests.api_support import api, make_user

pytestmark = pytest.mark.django_db

PATHS = {
    "/api/v1/jobs/": {"get", "post"},
    "/api/v1/jobs/{job_id}/": {"get"},
    "/api/v1/jobs/{job_id}/acquire/": {"post"},
    "/api/v1/jobs/{job_id}/prewarm/": {"post"},
    "/api/v1/jobs/{job_id}/drain/": {"post"},
    "/api/v1/sandboxes/": {"get"},
    "/api/v1/sandboxes/{sandbox_id}/": {"get"},
    "/api/v1/sandboxes/{sandbox_id}/release/": {"post"},
}


def _schema() -> dict:
    _, token = make_user("schema-reader")
    response = api(token).get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return json.loads(response.content)


def test_the_schema_lists_every_trainer_path_and_method():
    paths = _schema()["paths"]
    for path, methods in PATHS.items():
        assert path in paths, path
        assert methods <= set(paths[path]), (path, set(paths[path]))


def test_the_schema_describes_the_acquire_request_and_answer_bodies():
    schema = _schema()
    op = schema["paths"]["/api/v1/jobs/{job_id}/acquire/"]["post"]
    request_ref = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    answer_ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
    components = schema["components"]["schemas"]
    request = components[request_ref.rsplit("/", 1)[1]]
    answer = components[answer_ref.rsplit("/", 1)[1]]
    assert {"image", "spec", "role", "timeout_s", "base_commit"} <= set(request["properties"])
    assert {"sandbox_id", "address", "token", "source", "wait_ms", "queue_ms"} <= set(
        answer["properties"]
    )
    job_create = schema["paths"]["/api/v1/jobs/"]["post"]
    assert "201" in job_create["responses"]


def test_healthz_answers_200_with_the_database_ok(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["ok"] is True
