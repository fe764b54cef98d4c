"""Site-wide plain views: liveness and JSON error pages for non-DRF paths."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import csrf
from django.views.decorators.csrf import csrf_exempt


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers and the database accepts a query."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        db_ok = True
    except Exception:  # noqa: BLE001 - any DB failure means "not healthy", reported as such
        db_ok = False
    return JsonResponse({"ok": db_ok, "database": db_ok}, status=200 if db_ok else 503)


def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask every page's host for /favicon.ico; answer "none" instead of a 404."""
    return HttpResponse(status=204)


@csrf_exempt  # a POST to an unknown /api/ path is a 404, whatever its cookies
def not_found(request: HttpRequest, exception: Exception | None = None) -> JsonResponse:
    return JsonResponse({"error": "not_found", "detail": "No such page."}, status=404)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """A session request without its CSRF token: JSON under /api/, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse(
            {"error": "forbidden", "detail": f"CSRF check failed: {reason}"}, status=403
        )
    return csrf.csrf_failure(request, reason=reason)


def server_error(request: HttpRequest) -> JsonResponse:
    return JsonResponse(
        {"error": "server_error", "detail": "Internal error; it has been logged."}, status=500
    )
