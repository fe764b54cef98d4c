"""Site-wide plain views: liveness, readiness and JSON error pages for non-DRF paths."""

from __future__ import annotations

from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import csrf
from django.views.decorators.csrf import csrf_exempt

from sandman_site import election


def _database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:  # noqa: BLE001 - any DB failure means "not healthy", reported as such
        return False


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness: the process answers and the database accepts a query."""
    db_ok = _database_ok()
    return JsonResponse({"ok": db_ok, "database": db_ok}, status=200 if db_ok else 503)


def readyz(request: HttpRequest) -> JsonResponse:
    """Readiness: the database answers and, where replicas elect a leader, this replica
    holds the controller's Lease -- so the Kubernetes Service sends trainers to the leader
    only. A standby answers 503 ``not_leader`` (it stays live: ``/healthz``)."""
    db_ok = _database_ok()
    elector = election.current()
    body: dict[str, object] = {"ok": db_ok, "database": db_ok, "leader_election": False}
    if elector is not None:
        body.update(
            leader_election=True,
            identity=elector.identity,
            leading=elector.leading,
            holder=elector.holder(),
        )
    if not db_ok:
        body.update(ok=False, error="database_unavailable", detail="The database does not answer.")
    elif elector is not None and not elector.leading:
        body.update(
            ok=False,
            error="not_leader",
            detail=f"Replica {elector.identity} is a standby; {elector.holder() or 'nobody'} "
            "holds the controller's Lease.",
        )
    return JsonResponse(body, status=200 if body["ok"] else 503)


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
