"""GPU-hour accounting (Table A49): database sums, the one-case-per-job rule, the page."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from incidents import selectors, services
from incidents.models import Incident
from incidents.selectors import Bounds

from .conftest import case_body, make_job

pytestmark = pytest.mark.django_db


def hours(low: int, high: int, cases: int) -> Bounds:
    return Bounds(Decimal(low), Decimal(high), cases)


def test_the_paper_fixture_reproduces_table_a49() -> None:
    """Table A49: the 10 cases with a GPU-hour account, by class and path, and by workload."""
    call_command("loaddata", "paper_cases", verbosity=0)
    acc = selectors.accounting()

    by_class = {(r.path, r.label): r.bounds for r in acc.by_class}
    assert by_class == {
        ("sandbox", "sandbox implementation"): hours(974, 1469, 2),
        ("sandbox", "implementation and Kubernetes default"): hours(123, 135, 1),
        ("sandbox", "cluster or shared service"): hours(1020, 1207, 3),
        ("sandbox", "not established"): hours(1347, 1347, 2),
        ("outside", "cluster or shared service"): hours(1309, 1309, 1),
        ("outside", "not established"): hours(2351, 2351, 1),
    }
    assert acc.totals["sandbox"] == hours(3464, 4158, 8)
    assert acc.totals["outside"] == hours(3660, 3660, 2)
    assert acc.totals["all"] == hours(7124, 7818, 10)

    sandbox_workloads = {r.workload: r.bounds for r in acc.by_workload if r.path == "sandbox"}
    assert sandbox_workloads["stress test"] == hours(974, 1347, 1)
    assert sandbox_workloads["evaluation"] == hours(973, 1145, 1)
    assert sandbox_workloads["extension of D"] == hours(1193, 1193, 2)
    campaigns = [b for w, b in sandbox_workloads.items() if w.startswith("campaign")]
    assert (sum(b.low for b in campaigns), sum(b.high for b in campaigns)) == (324, 473)


def test_every_fixture_case_passes_the_record_rules() -> None:
    call_command("loaddata", "paper_cases", verbosity=0)
    for incident in Incident.objects.all():
        incident.full_clean()
    call_command("loaddata", "paper_cases", verbosity=0)  # loading twice adds nothing
    assert Incident.objects.count() == 16


def record_case(
    title: str, *, jobs: list[int], low: int, high: int, now: Any, stage: str = "service_admission"
) -> Incident:
    body = case_body(
        title=title, jobs=jobs, gpu_hours_low=low, gpu_hours_high=high, stage=stage, workload="w"
    )
    body["started_at"] = timezone.now() - timedelta(days=1)
    body["ended_at"] = None
    return services.incident_create(data=body, recorded_by=None, now=now)


def test_a_job_counted_by_an_earlier_case_is_flagged_not_counted_twice() -> None:
    now = timezone.now()
    shared, own = make_job(name="shared"), make_job(name="own")
    first = record_case("first", jobs=[shared.pk], low=100, high=200, now=now)
    second = record_case(
        "second", jobs=[shared.pk, own.pk], low=50, high=60, now=now + timedelta(minutes=1)
    )
    third = record_case("third", jobs=[own.pk], low=5, high=7, now=now + timedelta(minutes=2))
    unlinked = record_case("unlinked", jobs=[], low=1, high=1, now=now + timedelta(minutes=3))
    # A case without an account never claims a job.
    services.incident_create(
        data=case_body(
            title="no account",
            jobs=[shared.pk],
            gpu_hours_low=None,
            gpu_hours_high=None,
            gpu_hours_basis=None,
        ),
        recorded_by=None,
        now=now - timedelta(days=1),
    )

    acc = selectors.accounting()
    flags = {c.title: c.overlaps_with for c in acc.cases}
    # "third" shares a job only with "second", which is earlier and has an account.
    assert flags == {"first": None, "second": first.pk, "third": second.pk, "unlinked": None}
    assert acc.totals["all"] == hours(101, 201, 2)
    assert [c.pk for c in selectors.accounting_flagged(acc)] == [second.pk, third.pk]
    assert unlinked.pk in {c.pk for c in acc.cases}


def test_equal_recording_times_fall_back_to_the_lower_id() -> None:
    now = timezone.now()
    job = make_job()
    a = record_case("a", jobs=[job.pk], low=1, high=2, now=now)
    b = record_case("b", jobs=[job.pk], low=3, high=4, now=now)
    assert {c.pk: c.overlaps_with for c in selectors.accounting().cases} == {a.pk: None, b.pk: a.pk}


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
