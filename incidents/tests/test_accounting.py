"""GPU-hour accounting (Table A49): database sums and the one-case-per-job rule.

The pages that show it are tested with the operator pages (``dashboards/tests/pages``).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.management import call_command
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
