"""The incidents pages (the latest cases, the GPU-hour accounting and its CSV) over Django's
test client, with the paper fixture's cases (Table A49).
"""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from dashboards.tests.factories import make_staff

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_user() -> Any:
    return make_staff()


def test_the_accounting_page_needs_a_login_and_shows_table_and_chart(staff_user: Any) -> None:
    call_command("loaddata", "paper_cases", verbosity=0)
    anonymous = Client().get("/incidents/accounting/")
    assert anonymous.status_code == 302 and "/admin/login/" in anonymous["Location"]

    client = Client()
    client.force_login(staff_user)
    page = client.get("/incidents/accounting/").content.decode()
    assert '<script src="/static/plotly/plotly.min.js"></script>' in page
    assert "cdn" not in page.lower()
    assert 'id="accounting-by-class"' in page and 'id="accounting-by-workload"' in page
    assert 'id="total-all">7,124–7,818</td>' in page
    assert 'id="total-outside">3,660</td>' in page
    assert 'id="flagged-note"' not in page  # the fixture links no jobs, so nothing overlaps


def test_a_logged_in_user_who_is_not_staff_is_refused_the_accounting_and_its_csv() -> None:
    """The operator pages' one rule: a trainer's login is not enough (it used to be)."""
    call_command("loaddata", "paper_cases", verbosity=0)
    client = Client()
    client.force_login(get_user_model().objects.create_user("trainer", password="pw"))
    for address in ("/incidents/accounting/", "/incidents/accounting/csv/", "/incidents/"):
        response = client.get(address)
        assert response.status_code == 403, address
        assert response.json()["error"] == "forbidden"
        assert "7,124" not in response.content.decode()


def test_the_incidents_index_lists_recorded_cases(staff_user: Any) -> None:
    call_command("loaddata", "paper_cases", verbosity=0)
    client = Client()
    client.force_login(staff_user)
    page = client.get("/incidents/").content.decode()
    assert page.count("/admin/incidents/incident/") >= 16
    assert "Admission webhook collapse" in page and "973–1,145" in page


def test_the_accounting_csv_lists_classes_workloads_and_totals(staff_user: Any) -> None:
    call_command("loaddata", "paper_cases", verbosity=0)
    client = Client()
    client.force_login(staff_user)
    response = client.get("/incidents/accounting/csv/")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    total = next(r for r in rows if r["table"] == "total" and r["path"] == "all")
    assert (Decimal(total["gpu_hours_low"]), Decimal(total["gpu_hours_high"])) == (7124, 7818)
    assert sum(1 for r in rows if r["table"] == "class") == 6
