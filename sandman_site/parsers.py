"""The one JSON parser of the API: bounded in size, depth and number range.

Every JSON body of every view passes here (``DEFAULT_PARSER_CLASSES`` and
``JsonApiView.parser_classes``), so the limits hold for endpoints added later too:

* at most ``SANDMAN_API_MAX_BODY_BYTES`` bytes (413 ``too_large``; read no further);
* nested at most ``SANDMAN_API_MAX_JSON_DEPTH`` arrays/objects deep (400 ``too_deep``);
* integers within signed 64 bits (what PostgreSQL's ``bigint`` and the document's
  ``minimum``/``maximum`` say; 400 ``malformed_json``), finite numbers only (no
  ``NaN``/``Infinity``, which no JSON answer could carry back).

Invariant: a refused body has no side effect; these checks run before any view logic.
"""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from rest_framework import exceptions
from rest_framework.parsers import JSONParser

from sandman_site.errors import SandmanError

I64_MIN = -(2**63)
I64_MAX = 2**63 - 1


class BodyTooLarge(SandmanError):
    code = "too_large"
    status = 413


class BodyTooDeep(SandmanError):
    code = "too_deep"
    status = 400


def max_body_bytes() -> int:
    return int(settings.SANDMAN_API_MAX_BODY_BYTES)


def max_json_depth() -> int:
    return int(settings.SANDMAN_API_MAX_JSON_DEPTH)


def _bounded_int(text: str) -> int:
    value = int(text)
    if not I64_MIN <= value <= I64_MAX:
        raise ValueError(f"integer {text[:24]}... is outside the signed 64-bit range")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:24]} is too large for a 64-bit float")
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def depth_of(value: Any, *, limit: int) -> int:
    """The nesting depth of a parsed value, counting stops once it passes ``limit``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if deepest > limit:
                return deepest
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_json_bytes(raw: bytes) -> Any:
    """Parse a body by the rules above; raises ``ParseError`` / ``SandmanError``."""
    limit = max_json_depth()
    try:
        data = json.loads(
            raw.decode("utf-8"),
            parse_int=_bounded_int,
            parse_float=_finite_float,
            parse_constant=_refuse_constant,
        )
    except RecursionError as exc:
        raise BodyTooDeep(f"JSON nested more than {limit} levels deep.") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise exceptions.ParseError(f"JSON parse error - {exc}") from exc
    if depth_of(data, limit=limit) > limit:
        raise BodyTooDeep(f"JSON nested more than {limit} levels deep.")
    return data


class BoundedJSONParser(JSONParser):
    """DRF's JSON parser with the limits of this module."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = max_body_bytes()
        raw = stream.read(limit + 1) if stream is not None else b""
        if len(raw) > limit:
            raise BodyTooLarge(f"The request body is larger than {limit} bytes.")
        return parse_json_bytes(raw)
