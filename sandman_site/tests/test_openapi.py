"""The OpenAPI document says what the service answers (issue 12 item 1), for every operation.

The additions are central (``sandman_site.openapi.SandmanAutoSchema``), so these tests
walk every operation of the document: an endpoint added later is held to the same rules.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import override_settings

from sandboxes.tests.api_support import api, make_job, make_user, row_counts

pytestmark = pytest.mark.django_db

I64_MAX = 2**63 - 1
ERROR_REF = "#/components/schemas/Error"


def _schema() -> dict[str, Any]:
    _, token = make_user("schema-reader")
    response = api(token).get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    return json.loads(response.content)


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, op)
        for path, ops in schema["paths"].items()
        for method, op in ops.items()
    ]


def _error_schema(op: dict[str, Any], status: str) -> str | None:
    answer = op["responses"].get(status)
    if answer is None:
        return None
    return answer["content"]["application/json"]["schema"]["$ref"]


def test_every_operation_declares_its_error_answers_with_the_error_body() -> None:
    schema = _schema()
    error = schema["components"]["schemas"]["Error"]
    assert {"error", "detail"} <= set(error["required"])
    for method, path, op in _operations(schema):
        assert _error_schema(op, "401") == ERROR_REF, (method, path)
        if "{" in path:
            assert _error_schema(op, "404") == ERROR_REF, (method, path)
        if "requestBody" in op:
            for status in ("400", "413", "415"):
                assert _error_schema(op, status) == ERROR_REF, (method, path, status)
        if method != "GET":
            assert _error_schema(op, "403") == ERROR_REF, (method, path)
        for status, answer in op["responses"].items():
            if status >= "400":
                assert answer["content"]["application/json"]["schema"]["$ref"] == ERROR_REF


def test_a_view_declares_what_its_logic_raises_beyond_its_configuration() -> None:
    paths = _schema()["paths"]
    op = paths["/api/v1/task-sets/"]["post"]
    assert _error_schema(op, "404") == ERROR_REF  # an unknown task in the body
    # 409s a caller's own objects reach (a fuzzer with a staff token met the first two)
    for path, method in [
        ("/api/v1/jobs/{job_id}/", "delete"),  # job_not_drained
        ("/api/v1/sandboxes/{sandbox_id}/renew/", "post"),  # not in use
        ("/api/v1/incidents/{incident_id}/", "patch"),  # a status move not listed
        ("/api/v1/tasks/", "post"),  # task_exists
        ("/api/v1/task-sets/", "post"),
        ("/api/v1/gradings/", "post"),  # not_certified, job not active
        ("/api/v1/task-sets/{task_set_id}/preflight/", "post"),
        ("/api/v1/sandboxes/{sandbox_id}/capture/", "post"),
    ]:
        assert _error_schema(paths[path][method], "409") == ERROR_REF, (method, path)
    assert _error_schema(paths["/api/v1/gradings/"]["post"], "404") == ERROR_REF
    assert _error_schema(paths["/api/v1/sandboxes/{sandbox_id}/capture/"]["post"], "502")


def test_paginated_lists_are_declared_as_the_page_envelope_with_bounded_parameters() -> None:
    schema = _schema()
    components = schema["components"]["schemas"]
    for path in ("/api/v1/jobs/", "/api/v1/sandboxes/", "/api/v1/incidents/"):
        op = schema["paths"][path]["get"]
        ref = op["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        page = components[ref.rsplit("/", 1)[1]]
        assert {"count", "next", "previous", "results"} <= set(page["properties"]), path
        assert page["properties"]["results"]["type"] == "array"
        params = {p["name"]: p["schema"] for p in op["parameters"]}
        assert params["limit"]["maximum"] == 1000
        assert params["offset"]["maximum"] == I64_MAX


def test_every_integer_the_client_sends_is_bounded_to_64_bits() -> None:
    schema = _schema()
    for method, path, op in _operations(schema):
        for parameter in op.get("parameters", []):
            if parameter["schema"].get("type") == "integer":
                assert parameter["schema"]["maximum"] <= I64_MAX, (method, path, parameter)
    stack: list[Any] = [schema["components"]["schemas"]]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "integer":
                assert node["maximum"] <= I64_MAX and node["minimum"] >= -(2**63), node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _unbounded_inputs(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every string without ``maxLength`` (an enum is bounded by its values) and every
    integer without both bounds in a request body or a query parameter, with where."""
    components = schema["components"]["schemas"]
    found: list[tuple[str, dict[str, Any]]] = []
    todo: list[tuple[Any, str, frozenset[str]]] = []
    for method, path, op in _operations(schema):
        for parameter in op.get("parameters", []):
            if parameter["in"] == "query":
                todo.append(
                    (parameter["schema"], f"{method} {path} ?{parameter['name']}", frozenset())
                )
        for media, content in op.get("requestBody", {}).get("content", {}).items():
            todo.append((content["schema"], f"{method} {path} body {media}", frozenset()))
    while todo:
        node, where, seen = todo.pop()
        if not isinstance(node, dict):
            continue
        if "$ref" in node:
            name = node["$ref"].rsplit("/", 1)[1]
            if name not in seen:  # a recursive component is walked once per path
                todo.append((components[name], f"{where} > {name}", seen | {name}))
            continue
        kind = node.get("type")
        if kind == "string" and "maxLength" not in node and "enum" not in node:
            found.append((where, node))
        if kind == "integer" and not {"minimum", "maximum"} <= set(node):
            found.append((where, node))
        for name, child in node.get("properties", {}).items():
            todo.append((child, f"{where}.{name}", seen))
        for key in ("items", "additionalProperties"):
            todo.append((node.get(key), f"{where}[{key}]", seen))
        for key in ("allOf", "oneOf", "anyOf"):
            todo += [(child, f"{where} <{key}>", seen) for child in node.get(key, [])]
    return found


def test_every_string_and_integer_a_client_sends_declares_its_bounds() -> None:
    """Request bodies and query strings: ``maxLength`` on every string, ``minimum`` and
    ``maximum`` on every integer, so a generated client (and a fuzzer) knows the limits."""
    schema = _schema()
    assert _unbounded_inputs(schema) == []
    # the walk does look: the acquire body's quantities are reached through two refs
    spec = schema["components"]["schemas"]["Spec"]["properties"]["cpu"]["oneOf"][0]
    assert spec["maxLength"] == 64


def test_the_walk_finds_an_unbounded_string_and_integer() -> None:
    """The check above can fail: a document with one of each is caught."""
    schema = {
        "components": {"schemas": {"In": {"properties": {"s": {"type": "string"}}}}},
        "paths": {
            "/x/": {
                "post": {
                    "parameters": [{"in": "query", "name": "n", "schema": {"type": "integer"}}],
                    "requestBody": {
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/In"}}
                        }
                    },
                }
            }
        },
    }
    assert [where for where, _ in _unbounded_inputs(schema)] == [
        "POST /x/ body application/json > In.s",
        "POST /x/ ?n",
    ]


@pytest.mark.parametrize(
    "path,body",
    [
        ("acquire", {"image": "sandman/empty", "spec": {"cpu": "1" * 65, "memory": "1Gi"}}),
        (
            "prewarm",
            {"keys": [{"image": "i", "spec": {"cpu": "1", "memory": "9" * 65}, "count": 1}]},
        ),
    ],
)
def test_a_quantity_longer_than_declared_is_a_400(path: str, body: dict[str, Any]) -> None:
    user, token = make_user("quantity-writer")
    job = make_job(user)
    before = row_counts()
    response = api(token).post(f"/api/v1/jobs/{job.pk}/{path}/", body, format="json")
    assert response.status_code == 400, response.content
    assert "64 characters" in response.content.decode()
    assert row_counts() == before


def test_the_security_schemes_are_the_token_header_and_the_session_cookie() -> None:
    schema = _schema()
    schemes = schema["components"]["securitySchemes"]
    assert schemes["tokenAuth"] == {
        "type": "apiKey",
        "in": "header",
        "name": "Authorization",
        "description": 'Token-based authentication with required prefix "Token"',
    }
    assert schemes["cookieAuth"]["in"] == "cookie"
    for method, path, op in _operations(schema):
        assert {"tokenAuth": []} in op["security"], (method, path)


def test_the_throttled_hot_routes_declare_429_with_retry_after() -> None:
    schema = _schema()
    for path in ("/api/v1/jobs/{job_id}/acquire/", "/api/v1/sandboxes/{sandbox_id}/release/"):
        answer = schema["paths"][path]["post"]["responses"]["429"]
        assert answer["content"]["application/json"]["schema"]["$ref"] == ERROR_REF
        assert "Retry-After" in answer["headers"]


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/sandboxes/?job=5616926938102434924725272576",
        "/api/v1/incidents/?job=7164711169291001437807945103441920",
    ],
)
def test_a_query_id_beyond_64_bits_is_a_400_not_a_500(path: str) -> None:
    """Issue 12: these answered 500 (OverflowError) on SQLite."""
    _, token = make_user("big-id")
    response = api(token).get(path)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid"


def test_a_path_id_beyond_64_bits_is_a_404() -> None:
    _, token = make_user("big-path")
    response = api(token).get("/api/v1/jobs/5616926938102434924725272576/")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


@override_settings(DEBUG=True)
@pytest.mark.parametrize("method", ["get", "post"])
def test_an_unknown_api_path_is_a_json_404_even_with_debug_on(method: str) -> None:
    client = api(None)
    client.cookies["sessionid"] = "not-a-session"  # a cookie must not turn it into CSRF HTML
    response = getattr(client, method)("/api/v1/nope/")
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"error": "not_found", "detail": "No such page."}


def test_a_session_post_without_csrf_under_api_is_a_json_403() -> None:
    from rest_framework.test import APIClient

    user, _ = make_user("session-user")
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    before = row_counts()
    response = client.post("/api/v1/jobs/", {"name": "x", "egress": "deny"}, format="json")
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"
    assert row_counts() == before


def test_a_huge_limit_is_clamped_to_the_maximum_page_size() -> None:
    user, token = make_user("pager")
    make_job(user)
    response = api(token).get(f"/api/v1/jobs/?limit={10**30}&offset={10**30}")
    assert response.status_code == 200
    assert response.json()["results"] == []
    assert response.json()["count"] == 1
