"""Site-wide plain views: liveness, readiness and JSON error pages for non-DRF paths."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views import csrf
from django.views.decorators.csrf import csrf_exempt

from sandman_site import api_errors, election
from sandman_site.errors import ControllerUnavailable


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
    only. A standby answers 503 ``not_leader`` (it stays live: ``/healthz``).

    A web worker of split processes (``SANDMAN_CONTROLLER_SOCKET``) runs no elector: it
    asks the controller process (``ping``), and is ready only while that one answers, has
    started (and so reconciled, and holds the Lease where replicas elect); otherwise 503
    ``controller_unavailable`` with ``Retry-After`` (a draining controller process takes
    no new connection: unreachable)."""
    db_ok = _database_ok()
    body: dict[str, object] = {"ok": db_ok, "database": db_ok, "leader_election": False}
    if settings.SANDMAN_CONTROLLER_SOCKET:
        _controller_process_readiness(body)
    else:
        _elector_readiness(body)
    if not db_ok:
        body.update(ok=False, error="database_unavailable", detail="The database does not answer.")
    response = JsonResponse(body, status=200 if body["ok"] else 503)
    if body.get("error") == "controller_unavailable":
        response["Retry-After"] = str(api_errors.controller_retry_after_s())
    return response


def _elector_readiness(body: dict[str, object]) -> None:
    body.update(election.describe())
    if body["leader_election"] and not body["leading"]:
        body.update(
            ok=False,
            error="not_leader",
            detail=f"Replica {body['identity']} is a standby; {body['holder'] or 'nobody'} "
            "holds the controller's Lease.",
        )


def _controller_process_readiness(body: dict[str, object]) -> None:
    from sandboxes.apis.common import controller  # a web worker's RemoteController
    from sandboxes.controller.remote import RemoteController

    remote = controller()
    assert isinstance(remote, RemoteController)
    try:
        state = remote.ready()
    except ControllerUnavailable as exc:
        body.update(
            ok=False,
            controller="unreachable",
            error="controller_unavailable",
            detail=f"{exc.message} (a standby waiting for the Lease, a restart or a drain).",
        )
        return
    started = bool(state.pop("started", False))
    body.update(state, controller="started" if started else "starting")
    if not started:
        body.update(
            ok=False, error="controller_unavailable", detail="The controller process is starting."
        )
    elif body["leader_election"] and not body.get("leading"):
        body.update(ok=False, error="not_leader", detail="The controller process is a standby.")


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
