"""The one access rule of the operator pages: active staff only (``is_active`` and ``is_staff``).

It covers every page (:func:`operator_page`), every data and CSV endpoint
(:func:`operator_data`) and the websocket (``dashboards.consumers`` asks
:func:`is_operator`). Operators log in through the admin login (``/admin/login/``).

* Anonymous: a page redirects to the admin login with ``?next=`` the page; a data endpoint
  answers JSON 401 ``not_authenticated`` (a script gets an error it can read, never a login
  page); the socket is closed with 4403 before the handshake.
* Logged in but not active staff: JSON 403 ``forbidden`` from pages and data endpoints
  alike; the socket is closed with 4403.
* Only GET and HEAD: anything else is JSON 405, checked before access.
* A :class:`~sandman_site.errors.SandmanError` the view raises (``minutes`` out of range,
  an unknown chart) becomes its JSON 4xx, never a 500.

Rule a reader must not break: every view routed by ``dashboards.urls`` is wrapped by one of
the two decorators (``dashboards.tests.test_access`` walks the URL map to check it).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from dashboards.export import error_response, json_response
from sandman_site.errors import SandmanError

View = Callable[..., HttpResponse]

# What each decorator stamps on the view it returns (``ACCESS_ATTRIBUTE``): page or data.
ACCESS_ATTRIBUTE = "operator_access"
PAGE = "page"
DATA = "data"
SAFE_METHODS = ("GET", "HEAD")


def is_operator(user: Any) -> bool:
    """The rule itself: an authenticated, active staff user."""
    return bool(
        user is not None
        and getattr(user, "is_authenticated", False)
        and getattr(user, "is_active", False)
        and getattr(user, "is_staff", False)
    )


def _not_allowed(request: HttpRequest) -> HttpResponse:
    response = json_response(
        {
            "error": "method_not_allowed",
            "detail": f"{request.method} is not allowed here; use GET.",
        },
        status=405,
    )
    response["Allow"] = ", ".join(SAFE_METHODS)
    return response


def _forbidden() -> HttpResponse:
    return json_response(
        {"error": "forbidden", "detail": "The dashboards are for staff users."}, status=403
    )


def _guarded(
    view: View, kind: str, refuse_anonymous: Callable[[HttpRequest], HttpResponse]
) -> View:
    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method not in SAFE_METHODS:
            return _not_allowed(request)
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return refuse_anonymous(request)
        if not is_operator(user):
            return _forbidden()
        try:
            return view(request, *args, **kwargs)
        except SandmanError as exc:
            return error_response(exc)

    setattr(wrapped, ACCESS_ATTRIBUTE, kind)
    return wrapped


def _to_login(request: HttpRequest) -> HttpResponse:
    return redirect_to_login(request.get_full_path(), reverse("admin:login"))


def _not_authenticated(request: HttpRequest) -> HttpResponse:
    return json_response(
        {"error": "not_authenticated", "detail": "Log in as staff at /admin/login/."}, status=401
    )


def operator_page(view: View) -> View:
    """An operator page: anonymous visitors are sent to the admin login."""
    return _guarded(view, PAGE, _to_login)


def operator_data(view: View) -> View:
    """An operator data or CSV endpoint: anonymous callers get JSON 401."""
    return _guarded(view, DATA, _not_authenticated)
