"""The database is down: every request that needed it gets ``503 database_unavailable``.

PostgreSQL restarting (or unreachable, or SQLite locked past its busy timeout) surfaces
as ``django.db.OperationalError`` / ``InterfaceError`` wherever the ORM runs, and as
psycopg's own ``OperationalError`` / ``InterfaceError`` on the async connections the direct
hand-out uses outside the ORM (``sandboxes.apis.direct``; Django wraps the same errors
into its classes of the same names). DRF views
translate it in ``api_errors.exception_handler``; this middleware does the same for
everything else (plain Django views, the admin, dashboards), so a client never sees a
500 or an HTML page for an outage. Both answer ``{"error": "database_unavailable",
"detail": ...}`` with ``Retry-After: 1``.

Invariant: nothing is written half-way by an outage, because every service write is one
transaction (a failed COMMIT rolls back); recovery needs no action: Django closes a
connection that saw an error at the end of the request (``close_if_unusable_or_obsolete``)
and the controller's database executor replaces its broken ones, so the first request
after PostgreSQL is back gets a fresh connection.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse

log = logging.getLogger(__name__)

OUTAGE_ERRORS = (OperationalError, InterfaceError, psycopg.OperationalError, psycopg.InterfaceError)
CODE = "database_unavailable"
DETAIL = "The database is not reachable right now; nothing was changed. Retry shortly."


def outage_body() -> dict[str, str]:
    return {"error": CODE, "detail": DETAIL}


class DatabaseUnavailableMiddleware:
    """``process_exception`` turns a database outage into the 503 answer."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not isinstance(exception, OUTAGE_ERRORS):
            return None
        log.warning("database unavailable for %s %s: %s", request.method, request.path, exception)
        response = JsonResponse(outage_body(), status=503)
        response["Retry-After"] = "1"
        return response
