"""The one access rule of the operator pages, over every route of ``dashboards.urls``.

Active staff only: anonymous visitors of a page are sent to the admin login and anonymous
callers of a data/CSV endpoint get JSON 401; a logged-in user who is not staff gets JSON
403 from both; the websocket applies the same rule (``test_consumers``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.urls import URLPattern, reverse

from dashboards import urls
from dashboards.access import ACCESS_ATTRIBUTE, DATA, PAGE, is_operator
from dashboards.tests.factories import make_staff

pytestmark = pytest.mark.django_db

# One concrete address per route (a chart of that page where the route takes one).
ROUTE_ARGS: dict[str, dict[str, str]] = {
    "dashboard-chart-json": {"chart": "states"},
    "dashboard-chart-csv": {"chart": "states"},
    "operations-chart-json": {"chart": "warm_use"},
    "operations-chart-csv": {"chart": "warm_use"},
    "training-chart-json": {"chart": "critical_path"},
    "training-chart-csv": {"chart": "critical_path"},
    "gradings-chart-json": {"chart": "verdicts"},
    "gradings-chart-csv": {"chart": "verdicts"},
}


def _routes() -> list[tuple[str, str, str]]:
    """(url name, address, kind) of every route of the operator pages."""
    routes = []
    for pattern in urls.urlpatterns:
        assert isinstance(pattern, URLPattern)
        name = pattern.name
        assert name is not None
        kind = getattr(pattern.callback, ACCESS_ATTRIBUTE, None)
        routes.append((name, reverse(name, kwargs=ROUTE_ARGS.get(name)), str(kind)))
    return routes


ROUTES = _routes()


def _logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_every_route_is_a_guarded_page_or_data_endpoint() -> None:
    assert {kind for _, _, kind in ROUTES} == {PAGE, DATA}
    assert {name for name, _, kind in ROUTES if kind == PAGE} == {
        "dashboard",
        "operations",
        "training",
        "gradings",
        "incidents-index",
        "incidents-accounting",
    }


@pytest.mark.parametrize(("name", "address", "kind"), ROUTES, ids=[r[0] for r in ROUTES])
def test_anonymous_visitors_log_in_for_pages_and_get_json_401_from_data(
    name: str, address: str, kind: str
) -> None:
    response = Client().get(address)
    if kind == PAGE:
        assert response.status_code == 302
        assert response["Location"].startswith(f"/admin/login/?next={address}")
    else:
        assert (response.status_code, response.json()["error"]) == (401, "not_authenticated")


@pytest.mark.parametrize(("name", "address", "kind"), ROUTES, ids=[r[0] for r in ROUTES])
def test_a_logged_in_user_who_is_not_staff_is_refused_with_403(
    name: str, address: str, kind: str
) -> None:
    trainer = get_user_model().objects.create_user(username="trainer-x", password="pw")
    response = _logged_in(trainer).get(address)
    assert response.status_code == 403
    assert response.json()["error"] == "forbidden"


@pytest.mark.parametrize(("name", "address", "kind"), ROUTES, ids=[r[0] for r in ROUTES])
def test_staff_are_served_every_route(name: str, address: str, kind: str) -> None:
    response = _logged_in(make_staff()).get(address)
    assert response.status_code == 200
    if address.endswith((".csv", "/csv/")):
        assert response["Content-Type"].startswith("text/csv")


@pytest.mark.parametrize(("name", "address", "kind"), ROUTES, ids=[r[0] for r in ROUTES])
def test_only_get_and_head_are_allowed_even_for_staff(name: str, address: str, kind: str) -> None:
    response = _logged_in(make_staff()).post(address)
    assert (response.status_code, response.json()["error"]) == (405, "method_not_allowed")
    assert response["Allow"] == "GET, HEAD"


def test_an_inactive_staff_user_is_not_an_operator() -> None:
    """The session of a deactivated account no longer authenticates, and the rule itself
    refuses an inactive user whatever backend let it through."""
    retired = get_user_model().objects.create_user(
        username="retired", password="pw", is_staff=True, is_active=False
    )
    response = _logged_in(retired).get("/operations/")
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert not is_operator(SimpleNamespace(is_authenticated=True, is_active=False, is_staff=True))
    assert is_operator(SimpleNamespace(is_authenticated=True, is_active=True, is_staff=True))
    assert not is_operator(None)
