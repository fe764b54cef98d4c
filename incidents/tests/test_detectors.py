"""Detectors open draft incidents from recorded events, once per case.

Events are written as the controller records them; each test runs the real
``incidents.detectors.run_all`` (or ``services.ownerless_pods_found``) over them.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, transaction

from incidents import detectors, services
from incidents.models import Incident, OwnerlessPod
from incidents.services import Draft
from incidents.states import EvidenceKind, IncidentStatus, Stage
from sandboxes import events
from sandboxes.states import AcquisitionOutcome

from .conftest import T0, acquisition, make_job, make_sandbox, record

pytestmark = pytest.mark.django_db
MIN = timedelta(minutes=1)


def creates(job: Any, minute: int, *, sent: int, failed: int, status: int = 500) -> list:
    """``sent`` creates in minute ``minute`` after T0, the first ``failed`` answered ``status``."""
    at = T0 + minute * MIN
    boxes = []
    for i in range(sent):
        box = make_sandbox(job, at=at)
        record(box, events.CREATE_SENT, at + timedelta(seconds=i % 50))
        if i < failed:
            record(
                box,
                events.CREATE_ERROR,
                at + timedelta(seconds=i % 50 + 1),
                status=status,
                error='admission webhook "policy" failed: HTTP 500',
            )
        boxes.append(box)
    return boxes


def test_a_burst_of_5xx_creates_opens_one_linked_production_draft() -> None:
    job = make_job(name="evaluation")
    other = make_job(name="other tenant job")
    failed = creates(job, 0, sent=20, failed=10)[:10]
    failed += creates(other, 1, sent=10, failed=6, status=503)[:6]

    opened = detectors.run_all(now=T0 + 5 * MIN)

    assert len(opened) == 1
    case = Incident.objects.get(pk=opened[0].pk)
    assert case.detector_key == detectors.CREATE_ERRORS
    assert case.detector_window == "2026-10-14T19:00Z"
    assert case.status == IncidentStatus.OPEN
    assert case.evidence_kind == EvidenceKind.PRODUCTION
    assert case.stage == Stage.SERVICE_ADMISSION
    assert (case.started_at, case.ended_at) == (T0, T0 + 2 * MIN)
    assert set(case.sandboxes.values_list("pk", flat=True)) == {b.pk for b in failed}
    assert set(case.jobs.values_list("pk", flat=True)) == {job.pk, other.pk}
    assert case.detector_detail["hits"] == 16 and case.detector_detail["total"] == 30
    assert "16 of 30 pod creates" in case.what_happened
    assert case.cause_class_label == "not established"


def test_re_running_the_detectors_opens_nothing_new() -> None:
    job = make_job()
    creates(job, 0, sent=20, failed=10)
    first = detectors.run_all(now=T0 + 5 * MIN)
    again = detectors.run_all(now=T0 + 5 * MIN)
    later = detectors.run_all(now=T0 + 9 * MIN)
    assert len(first) == 1
    assert again == [] and later == []
    assert Incident.objects.count() == 1


def test_below_threshold_create_errors_open_nothing() -> None:
    job = make_job()
    creates(job, 0, sent=20, failed=2)  # 10% < 20% share
    creates(job, 2, sent=4, failed=4)  # 100%, but fewer than 5 errors
    creates(job, 4, sent=20, failed=15, status=409)  # 4xx answers are not 5xx
    assert detectors.run_all(now=T0 + 10 * MIN) == []
    assert not Incident.objects.exists()


def test_the_create_error_threshold_is_a_setting(settings: Any) -> None:
    job = make_job()
    creates(job, 0, sent=20, failed=10)  # 50%
    settings.SANDMAN_DETECT_CREATE_ERROR_SHARE = 0.6
    assert detectors.run_all(now=T0 + 5 * MIN) == []
    settings.SANDMAN_DETECT_CREATE_ERROR_SHARE = 0.5
    assert len(detectors.run_all(now=T0 + 5 * MIN)) == 1


def test_a_burst_seen_across_runs_stays_one_case_and_a_later_burst_opens_another() -> None:
    job = make_job()
    creates(job, 0, sent=10, failed=8)
    [case] = detectors.run_all(now=T0 + 2 * MIN)
    continued = creates(job, 4, sent=10, failed=9)[:9]  # within the 5-minute merge gap

    assert detectors.run_all(now=T0 + 6 * MIN) == []
    case.refresh_from_db()
    assert case.ended_at == T0 + 5 * MIN
    assert set(b.pk for b in continued) <= set(case.sandboxes.values_list("pk", flat=True))
    assert case.detector_detail["hits"] == 17

    creates(job, 40, sent=10, failed=10)
    [second] = detectors.run_all(now=T0 + 42 * MIN)
    assert second.pk != case.pk and second.detector_window == "2026-10-14T19:40Z"


def test_events_older_than_the_look_back_are_not_read(settings: Any) -> None:
    settings.SANDMAN_DETECT_LOOKBACK_S = 600
    creates(make_job(), 0, sent=10, failed=10)
    assert detectors.run_all(now=T0 + 30 * MIN) == []


def test_address_failures_over_the_share_of_scheduled_sandboxes_open_a_draft() -> None:
    job = make_job()
    at = T0 + 10 * MIN
    failing = []
    for i in range(20):
        box = make_sandbox(job, at=at)
        record(box, events.SCHEDULED, at + timedelta(seconds=i), node="node-a")
        if i < 5:
            record(
                box, events.ADDRESS_FAILURE, at + timedelta(seconds=i + 1), node="node-a", count=1
            )
            failing.append(box.pk)

    [case] = detectors.run_all(now=at + 2 * MIN)

    assert case.detector_key == detectors.ADDRESS_FAILURES
    assert set(case.sandboxes.values_list("pk", flat=True)) == set(failing)
    assert "5 of 20 scheduled sandboxes" in case.what_happened
    assert "node-a" in case.what_happened
    assert detectors.run_all(now=at + 3 * MIN) == []


def test_a_few_address_failures_among_many_scheduled_sandboxes_open_nothing() -> None:
    job = make_job()
    at = T0 + 10 * MIN
    for i in range(100):
        box = make_sandbox(job, at=at)
        record(box, events.SCHEDULED, at + timedelta(seconds=i % 60))
        if i < 5:
            record(box, events.ADDRESS_FAILURE, at + timedelta(seconds=i % 60), node="n", count=1)
    assert detectors.run_all(now=at + 2 * MIN) == []


def test_a_burst_of_acquire_timeouts_opens_a_draft_linked_to_the_job() -> None:
    job = make_job(name="stress test")
    at = T0 + 20 * MIN
    for i in range(12):
        acquisition(job, AcquisitionOutcome.TIMEOUT, at + timedelta(seconds=i * 3))
    acquisition(job, AcquisitionOutcome.OK, at)

    [case] = detectors.run_all(now=at + 2 * MIN)

    assert case.detector_key == detectors.ACQUIRE_TIMEOUTS
    assert list(case.jobs.values_list("pk", flat=True)) == [job.pk]
    assert case.stage == Stage.CREATION
    assert "12 acquisitions" in case.what_happened
    assert detectors.run_all(now=at + 2 * MIN) == []


def test_acquire_timeouts_spread_thinly_over_minutes_open_nothing() -> None:
    job = make_job()
    for minute in range(5):
        for i in range(9):  # 9 per minute, threshold 10
            acquisition(job, AcquisitionOutcome.TIMEOUT, T0 + minute * MIN + timedelta(seconds=i))
    assert detectors.run_all(now=T0 + 10 * MIN) == []


def test_a_job_at_its_pod_cap_opens_one_draft_per_job_ever() -> None:
    capped = make_job(name="capped by events")
    refused = make_job(name="capped by acquisitions")
    calm = make_job(name="calm")
    box = make_sandbox(capped)
    record(box, events.POD_CAP, T0 + MIN, live=90, cap=90)
    acquisition(refused, AcquisitionOutcome.CAP, T0 + 2 * MIN)
    acquisition(calm, AcquisitionOutcome.OK, T0 + 2 * MIN)

    opened = detectors.run_all(now=T0 + 3 * MIN)

    assert sorted(c.detector_window for c in opened) == [f"job:{capped.pk}", f"job:{refused.pk}"]
    by_job = {c.jobs.get().pk: c for c in opened}
    assert list(by_job[capped.pk].sandboxes.values_list("pk", flat=True)) == [box.pk]
    # The job hits its cap again an hour later: still the same case.
    record(box, events.POD_CAP, T0 + 60 * MIN)
    assert detectors.run_all(now=T0 + 61 * MIN) == []
    assert Incident.objects.filter(detector_key=detectors.POD_CAP).count() == 2


def test_ownerless_pods_open_one_draft_and_are_never_reported_twice() -> None:
    now = T0
    first = services.ownerless_pods_found(names=["sbx-a", "sbx-b", "sbx-a"], now=now)
    assert first is not None
    assert first.stage == Stage.CLEANUP and first.status == IncidentStatus.OPEN
    assert first.detector_detail["pods"] == ["sbx-a", "sbx-b"]
    assert services.ownerless_pods_found(names=["sbx-b", "sbx-a"], now=now + MIN) is None
    assert services.ownerless_pods_found(names=[], now=now) is None

    second = services.ownerless_pods_found(names=["sbx-b", "sbx-c"], now=now + 2 * MIN)
    assert second is not None and second.pk != first.pk
    assert second.detector_detail["pods"] == ["sbx-c"]
    assert dict(OwnerlessPod.objects.values_list("name", "incident")) == {
        "sbx-a": first.pk,
        "sbx-b": first.pk,
        "sbx-c": second.pk,
    }


def test_the_database_refuses_a_second_incident_for_the_same_detector_window() -> None:
    draft = Draft(
        key="create_5xx_burst",
        window="2026-10-14T19:00Z",
        title="t",
        stage=Stage.SERVICE_ADMISSION,
        what_happened="w",
        how_found="h",
        effect="e",
        started_at=T0,
        ended_at=T0 + MIN,
        detail={},
    )
    assert services.detector_incident_open(draft=draft, job_ids=[], sandbox_ids=[], now=T0)
    assert services.detector_incident_open(draft=draft, job_ids=[], sandbox_ids=[], now=T0) is None
    with pytest.raises(IntegrityError), transaction.atomic():
        Incident.objects.create(
            title="dup",
            started_at=T0,
            stage=Stage.SERVICE_ADMISSION,
            what_happened="w",
            evidence_kind=EvidenceKind.PRODUCTION,
            recorded_at=T0,
            detector_key="create_5xx_burst",
            detector_window="2026-10-14T19:00Z",
        )
    assert Incident.objects.count() == 1
