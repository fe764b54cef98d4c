"""``AsyncJsonApiView``: a DRF ``APIView`` whose handlers are coroutines (the hot routes).

DRF 3.18 dispatches synchronously, so under ASGI Django would run the whole view in a
thread, open a database connection for it and block that thread on the controller.
Here ``dispatch`` is a coroutine run on the server's event loop: authentication comes
from ``access`` (no query for a known token), the handler awaits the controller's
``a*`` calls, and the answer is rendered in place. Everything else is DRF's own code:
``initialize_request``, ``initial`` (negotiation, permissions, throttles),
``handle_exception`` (so errors leave through ``sandman_site.api_errors`` as the same
``{"error", "detail"}`` JSON) and ``finalize_response``. drf-spectacular documents these
views like any other APIView (``extend_schema`` on the coroutine handler).

Invariants a reader must not break:
* Nothing here blocks the event loop: the database is reached only through ``access``
  (``sync_to_async``), and a handler whose validation may start a process (a git commit
  lookup) runs it with :func:`validate_off_loop`.
* Requests that are not ``Token <key>`` (session cookies, malformed headers) are
  authenticated by DRF's configured authenticators in the request's thread, with DRF's
  own error sentences.
"""

from __future__ import annotations

import inspect
from typing import Any

from asgiref.sync import sync_to_async
from django.http import HttpResponse
from rest_framework.authentication import get_authorization_header
from rest_framework.request import Request
from rest_framework.serializers import Serializer

from sandboxes.apis import access
from sandboxes.apis.common import JsonApiView


class AsyncJsonApiView(JsonApiView):
    """A JSON APIView whose ``post``/``get`` are ``async def``."""

    # An async dispatch: Django awaits it because the view is marked async (see as_view).
    async def dispatch(  # type: ignore[override]
        self, request: Any, *args: Any, **kwargs: Any
    ) -> HttpResponse:
        self.args = args
        self.kwargs = kwargs
        request = self.initialize_request(request, *args, **kwargs)
        self.request = request
        self.headers = self.default_response_headers
        try:
            await self._authenticate(request)
            self.initial(request, *args, **kwargs)
            method = request.method.lower()
            if method in self.http_method_names:
                handler = getattr(self, method, self.http_method_not_allowed)
            else:
                handler = self.http_method_not_allowed
            response = handler(request, *args, **kwargs)
            if inspect.isawaitable(response):
                response = await response
        except Exception as exc:
            response = self.handle_exception(exc)
        self.response = self.finalize_response(request, response, *args, **kwargs)
        return _rendered(self.response)

    async def _authenticate(self, request: Request) -> None:
        parts = get_authorization_header(request).split()
        if len(parts) == 2 and parts[0].lower() == b"token":
            try:
                key = parts[1].decode()
            except UnicodeError:
                key = ""
            if key:
                request.user, request.auth = await access.token_user(key)
                return
        # Anything else: DRF's authenticators, in the request's thread (they may query).
        await sync_to_async(lambda: request.user, thread_sensitive=True)()


async def validate_off_loop(serializer: Serializer, *, off_loop: bool) -> None:
    """``is_valid(raise_exception=True)``, in a worker thread when ``off_loop`` (checks
    that start a process or touch slow disks must not stall every other request)."""
    if off_loop:
        await sync_to_async(serializer.is_valid, thread_sensitive=False)(raise_exception=True)
    else:
        serializer.is_valid(raise_exception=True)


def _rendered(response: Any) -> HttpResponse:
    """A plain ``HttpResponse`` with the rendered body and every header.

    Django renders a template-like response (DRF's ``Response``) through a thread hop
    (``sync_to_async(response.render)``); rendering JSON here costs microseconds.
    """
    if not hasattr(response, "render"):
        return response
    response.render()
    plain = HttpResponse(response.content, status=response.status_code)
    for header, value in response.items():
        plain[header] = value
    return plain
