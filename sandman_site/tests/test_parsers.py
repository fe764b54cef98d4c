"""The bounded JSON parser (issue 12 item 6): body size, nesting depth, number range.

Each refusal is a clear 4xx ``{error, detail}`` and writes nothing; the limits come from
the settings the README lists.
"""

from __future__ import annotations

import pytest
from django.test import override_settings

from sandboxes.tests.api_support import api, make_user, row_counts
from sandman_site.parsers import depth_of

pytestmark = pytest.mark.django_db


def _post(token: str, body: bytes, path: str = "/api/v1/jobs/") -> object:
    return api(token).generic("POST", path, body, content_type="application/json")


@pytest.fixture
def token() -> str:
    return make_user("parser-user")[1]


@pytest.mark.parametrize("value", [str(2**63), str(-(2**63) - 1), "5616926938102434924725272576"])
def test_an_integer_outside_64_bits_is_a_400_and_writes_nothing(token: str, value: str) -> None:
    before = row_counts()
    body = f'{{"name": "x", "egress": "deny", "caps": {{"max_live": {value}}}}}'.encode()
    response = _post(token, body)
    assert response.status_code == 400
    assert response.json()["error"] == "malformed_json"
    assert "64-bit" in response.json()["detail"]
    assert row_counts() == before


def test_the_largest_64_bit_integer_reaches_the_serializer(token: str) -> None:
    body = f'{{"name": "x", "egress": "deny", "caps": {{"max_live": {2**63 - 1}}}}}'.encode()
    response = _post(token, body)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid"  # the field's own bound, not the parser's


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_are_a_400(token: str, literal: str) -> None:
    response = _post(token, f'{{"name": "x", "egress": "deny", "rate": {literal}}}'.encode())
    assert response.status_code == 400
    assert response.json()["error"] == "malformed_json"


@pytest.mark.parametrize("depth", [33, 5000, 200_000])
def test_json_nested_deeper_than_the_limit_is_a_400(token: str, depth: int) -> None:
    before = row_counts()
    response = _post(token, b"[" * depth + b"]" * depth)
    assert response.status_code == 400
    assert response.json()["error"] == "too_deep"
    assert row_counts() == before


def test_json_at_the_depth_limit_is_parsed(token: str) -> None:
    response = _post(token, b"[" * 32 + b"]" * 32)
    assert response.status_code == 400
    assert response.json()["error"] == "invalid"  # a list is not a job: the view's answer


@override_settings(SANDMAN_API_MAX_BODY_BYTES=1000)
def test_a_body_over_the_limit_is_a_413_and_writes_nothing(token: str) -> None:
    before = row_counts()
    body = b'{"name": "' + b"x" * 1000 + b'", "egress": "deny"}'
    response = _post(token, body)
    assert response.status_code == 413
    assert response.json()["error"] == "too_large"
    assert row_counts() == before


def test_depth_of_counts_containers_only() -> None:
    assert depth_of(1, limit=10) == 0
    assert depth_of({"a": [1, {"b": []}]}, limit=10) == 4
    assert depth_of([[[[[]]]]], limit=2) == 3  # stops counting past the limit
