"""DRF exception handler: every error leaves as ``{"error": code, "detail": sentence}``.

Sandman errors carry their own code and status; DRF's own errors (validation, auth,
404, method) are mapped to stable codes; a database outage is a 503 (``dbguard.py``). A
``503 controller_unavailable`` carries ``Retry-After`` (``controller_retry_after_s``: the
retry period of the Lease where replicas elect -- a failover is under way or the Service
has not yet moved -- else 1 s: split processes whose controller process is restarting or
draining).
Anything else is left to Django (a 500 is a bug).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from rest_framework import exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from sandman_site import election
from sandman_site.dbguard import OUTAGE_ERRORS, outage_body
from sandman_site.errors import ControllerUnavailable, SandmanError

_DRF_CODES = {
    exceptions.ValidationError: "invalid",
    exceptions.ParseError: "malformed_json",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "forbidden",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.Throttled: "throttled",
}


def describe_validation_error(detail: Any) -> str:
    """One sentence for a serializer's ``errors`` (what the API's ``detail`` says)."""
    return _sentence(detail)


def _sentence(detail: Any) -> str:
    if isinstance(detail, dict):
        parts = []
        for field, value in detail.items():
            parts.append(f"{field}: {_sentence(value)}")
        return "; ".join(parts)
    if isinstance(detail, list):
        return " ".join(_sentence(d) for d in detail)
    return str(detail)


def controller_retry_after_s() -> int:
    """When a ``controller_unavailable`` answer is worth resending, in whole seconds."""
    from django.conf import settings

    elector = election.current()
    if elector is not None:
        return elector.retry_after_s()
    if settings.SANDMAN_BACKEND == "kubernetes" and settings.SANDMAN_LEADER_ELECTION:
        return int(settings.SANDMAN_LEASE_RETRY_PERIOD_S)  # the controller process elects
    return 1


def exception_handler(exc: Exception, context: dict) -> Response | None:
    if isinstance(exc, SandmanError):
        error: dict[str, Any] = {"error": exc.code, "detail": exc.message}
        if exc.extra:
            error["extra"] = exc.extra
        headers = None
        if isinstance(exc, ControllerUnavailable):
            headers = {"Retry-After": str(controller_retry_after_s())}
        return Response(error, status=exc.status, headers=headers)
    if isinstance(exc, OUTAGE_ERRORS):  # PostgreSQL restarting or unreachable (dbguard.py)
        return Response(outage_body(), status=503, headers={"Retry-After": "1"})
    if isinstance(exc, RequestDataTooBig):  # a body over DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {"error": "too_large", "detail": "The request body is too large."}, status=413
        )
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = "error"
    for klass, name in _DRF_CODES.items():
        if isinstance(exc, klass):
            code = name
            break
    body: dict[str, Any] = {"error": code, "detail": _sentence(getattr(exc, "detail", exc))}
    if isinstance(exc, exceptions.ValidationError):
        body["fields"] = exc.detail
    response.data = body
    return response
