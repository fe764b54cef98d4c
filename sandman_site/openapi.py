"""The OpenAPI document tells the truth about every operation, added centrally.

``SandmanAutoSchema`` (``DEFAULT_SCHEMA_CLASS``) lets drf-spectacular describe each view
as usual, then adds what every Sandman view really answers but no view declares:

* the error answers its configuration implies, each with the one ``Error`` body
  (``{"error", "detail"}``, see ``sandman_site.api_errors``): 400 for a request body or
  query parameters, 413/415 for a request body, 401 when it needs a caller, 403 for an
  unsafe method (the session's CSRF check) or a permission beyond "authenticated", 404
  for a path with parameters, 429 (with ``Retry-After``) for a throttled view;
* what a view raises from its own logic, declared by the view with
  :func:`error_responses` (``@extend_schema(responses={200: Out, **error_responses(...)})``;
  a 503 declares ``Retry-After`` too);
* pagination: a ``GET`` whose 200 answer is ``many=True`` is a page of the
  ``DEFAULT_PAGINATION_CLASS`` (``{count, next, previous, results}`` and its ``limit`` /
  ``offset`` parameters) unless the view sets ``pagination_class = None``;
* bounds the input layer enforces for every body: integers within signed 64 bits
  (``sandman_site.parsers``); ids in paths are 64-bit too (a larger one is a 404); a
  date-time is at most 64 characters (a longer one is no date-time: 400). Every other
  string a client sends declares its own ``maxLength`` (a test walks the document).

Invariant: the additions only describe; a status is added only where the service can
answer it, and a declared answer of the view is never overwritten.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.settings import api_settings

from sandman_site.errors import SandmanError
from sandman_site.parsers import I64_MAX, I64_MIN

_UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}
_PAGE_PARAMETERS = {"limit", "offset"}  # out of range is clamped, never a 400
_DESCRIPTIONS = {
    "400": "Invalid input (`invalid`, `malformed_json`, or the operation's own code).",
    "401": "No token, or a token that is not valid (`not_authenticated`, `authentication_failed`).",
    "403": "Not allowed (`forbidden`): a staff-only write, or a session without CSRF token.",
    "404": "No such object, or one the caller may not see (`not_found`).",
    "409": "The object's state forbids the operation.",
    "413": "The request body is too large (`too_large`).",
    "415": "The request body is not JSON (`unsupported_media_type`).",
    "422": "The backend cannot honour the request as asked.",
    "429": "Too many requests (`throttled`) or a cap reached; retry after `Retry-After`.",
    "502": "The sandbox backend failed.",
    "503": "The controller is not running (`controller_unavailable`: a standby replica or a "
    "failover; resend with the same `Idempotency-Key` after `Retry-After`).",
    "504": "Waited longer than the operation's budget.",
}


class ErrorSerializer(serializers.Serializer):
    """Every error answer of the API (``sandman_site.api_errors``)."""

    class Meta:
        ref_name = "Error"

    error = serializers.CharField(help_text="a stable machine code, e.g. `not_found`")
    detail = serializers.CharField(help_text="one sentence for a person")
    extra = serializers.DictField(required=False, help_text="details of a Sandman error")
    # "fields" is a wire name; DRF's stubs type Serializer.fields as the bound-field map.
    fields = serializers.JSONField(  # type: ignore[assignment]
        required=False, help_text="per-field messages of a 400"
    )


def error_response(status: int | str) -> OpenApiResponse:
    """The ``Error`` answer for ``status``, with the catalogue's description."""
    return OpenApiResponse(ErrorSerializer, description=_DESCRIPTIONS.get(str(status), ""))


def error_responses(*errors: type[SandmanError] | int) -> dict[int, OpenApiResponse]:
    """``{status: Error answer}`` for what a view raises beyond its configuration (a
    ``SandmanError`` subclass, or a bare status), to spread into ``responses=``."""
    statuses = sorted({e if isinstance(e, int) else e.status for e in errors})
    return {status: error_response(status) for status in statuses}


class SandmanAutoSchema(AutoSchema):
    """drf-spectacular's AutoSchema plus the answers every Sandman view gives."""

    def _get_paginator(self) -> Any:
        if self.method != "GET":
            return None
        view_class = type(self.view)
        if "pagination_class" in dir(view_class):
            pagination_class = view_class.pagination_class  # type: ignore[attr-defined]
        else:
            pagination_class = api_settings.DEFAULT_PAGINATION_CLASS
        return pagination_class() if pagination_class else None

    def get_operation(self, *args: Any, **kwargs: Any) -> Any:
        operation = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        _bound_integer_parameters(operation)
        responses = operation.setdefault("responses", {})
        for status in self._implied_errors(operation):
            if status not in responses:
                responses[status] = self._get_response_for_code(error_response(status), status)
        for status in ("429", "503"):  # a throttle; a standby or a database outage
            if status in responses:
                responses[status].setdefault("headers", {})["Retry-After"] = {
                    "schema": {"type": "integer", "minimum": 0, "maximum": I64_MAX},
                    "description": "seconds to wait before the next request",
                }
        return operation

    def _implied_errors(self, operation: dict[str, Any]) -> list[str]:
        statuses: list[str] = []
        has_body = "requestBody" in operation
        has_query = any(
            p.get("in") == "query" and p.get("name") not in _PAGE_PARAMETERS
            for p in operation.get("parameters", [])
        )
        if has_body or has_query:
            statuses.append("400")
        if has_body:
            statuses += ["413", "415"]
        permissions = self.view.get_permissions()
        if not all(isinstance(p, AllowAny) for p in permissions):
            statuses.append("401")
        if self.method in _UNSAFE or any(
            not isinstance(p, (IsAuthenticated, AllowAny)) for p in permissions
        ):
            statuses.append("403")
        if "{" in self.path:
            statuses.append("404")
        if self.view.get_throttles():
            statuses.append("429")
        return statuses


def _bound_integer_parameters(operation: dict[str, Any]) -> None:
    """Path ids are 64-bit and not negative (anything else names no row: 404)."""
    for parameter in operation.get("parameters", []):
        schema = parameter.get("schema", {})
        if parameter.get("in") == "path" and schema.get("type") == "integer":
            schema.setdefault("minimum", 0)
            schema.setdefault("maximum", I64_MAX)


MAX_DATETIME_CHARS = 64


def bound_body_integers(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Postprocessing hook: every integer in a component without its own bounds gets the
    64-bit ones the JSON parser enforces (``sandman_site.parsers``), every date-time string
    the length no ISO 8601 date-time exceeds."""
    stack: list[Any] = [result.get("components", {}).get("schemas", {})]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if node.get("type") == "integer":
                node.setdefault("minimum", I64_MIN)
                node.setdefault("maximum", I64_MAX)
            if node.get("type") == "string" and node.get("format") in ("date-time", "date"):
                node.setdefault("maxLength", MAX_DATETIME_CHARS)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return result
