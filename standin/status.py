"""Kubernetes wire helpers for the stand-in: ``Status`` bodies and RFC 3339 times.

Every error the stand-in answers is a ``Status`` object with ``code`` equal to the HTTP
status, so the official client raises ``ApiException`` with that status and a body it can
parse. Times are always UTC with a ``Z`` suffix; ``precise`` adds microseconds (the
simulated timeline needs sub-second stamps, the API's own fields use whole seconds).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "AlreadyExists",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    500: "InternalError",
    504: "Timeout",
}


def status_body(
    code: int,
    message: str,
    *,
    reason: str | None = None,
    name: str | None = None,
    kind: str | None = None,
) -> dict[str, Any]:
    """A ``metav1.Status`` failure body."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, "Unknown"),
        "code": code,
    }
    if name is not None or kind is not None:
        body["details"] = {"name": name or "", "kind": kind or ""}
    return body


def success_body(name: str, kind: str, uid: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "kind": kind, "uid": uid},
    }


def rfc3339(when: dt.datetime, *, precise: bool = False) -> str:
    when = when.astimezone(dt.UTC)
    if precise:
        return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
