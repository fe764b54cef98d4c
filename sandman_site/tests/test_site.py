"""Site-wide endpoints: liveness, JSON errors for unknown paths, Plotly served locally."""

from __future__ import annotations

import pytest
from django.test import Client


@pytest.mark.django_db
def test_healthz_answers_ok_when_the_database_answers(client: Client) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"ok": True, "database": True}


@pytest.mark.django_db
def test_unknown_api_path_is_a_json_404(client: Client) -> None:
    response = client.get("/api/v1/no-such-thing/")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_plotly_js_is_found_by_staticfiles_from_the_installed_package() -> None:
    from django.contrib.staticfiles import finders

    path = finders.find("plotly/plotly.min.js")
    assert path is not None
    with open(path, "rb") as fh:
        head = fh.read(4096)
    assert b"plotly" in head.lower()
