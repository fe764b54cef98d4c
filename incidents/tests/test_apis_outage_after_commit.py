"""The database lost right after an incident write's COMMIT: the answer still tells the truth.

A create, a patch or an import that committed must not answer ``503 ... nothing was
changed`` because the view queried again to build its answer; each runs with every query
after its COMMIT failing as a dropped connection does (``sandman_site.testing.dbloss``).
"""

from __future__ import annotations

import pytest

from incidents.models import Incident
from incidents.tests.conftest import case_body
from sandman_site.testing.dbloss import database_lost_after_commit_of

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/incidents/"


def test_an_incident_create_answers_201_when_the_database_goes_after_its_commit(staff_api):
    with database_lost_after_commit_of("incidents_incident") as state:
        response = staff_api.post(URL, case_body(), format="json")
    assert state["committed"] == 1
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["title"] == "Admission webhook collapse"
    assert Incident.objects.filter(pk=data["id"]).exists()


def test_an_incident_patch_answers_200_when_the_database_goes_after_its_commit(staff_api):
    created = staff_api.post(URL, case_body(), format="json")
    assert created.status_code == 201, created.content
    incident_id = created.json()["id"]
    with database_lost_after_commit_of("incidents_incident") as state:
        response = staff_api.patch(f"{URL}{incident_id}/", {"title": "renamed"}, format="json")
    assert state["committed"] == 1
    assert response.status_code == 200, response.content
    assert response.json()["title"] == "renamed"
    assert Incident.objects.get(pk=incident_id).title == "renamed"


def test_an_incident_import_answers_its_counts_when_the_database_goes_after_its_commit(
    staff_api,
):
    with database_lost_after_commit_of("incidents_incident") as state:
        response = staff_api.post(f"{URL}import/", [case_body()], format="json")
    assert state["committed"] == 1
    assert response.status_code == 200, response.content
    assert response.json() == {"created": 1, "updated": 0}
    assert Incident.objects.count() == 1
