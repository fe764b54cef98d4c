"""``manage.py seed_history`` at a small size: the paper's distributions land in the tables
and the pages and the critical-path selector read them (issue 11 item 6; the 1M-row timings
are ``bench/dashboards.py``'s)."""

from __future__ import annotations

import io
import statistics

import pytest
from django.core.management import call_command
from django.test import Client

from dashboards.seeding.history import BURST
from dashboards.sql import DurationMs
from dashboards.tests.factories import make_staff
from sandboxes.models import Acquisition, Job, LearnerStep, Sandbox, Trajectory, TrajectoryPhase
from sandboxes.training_selectors import critical_path

pytestmark = pytest.mark.django_db


def test_seed_history_writes_a_month_with_the_papers_shapes_that_the_pages_read() -> None:
    out = io.StringIO()
    call_command("seed_history", sandboxes=6000, trajectories=1500, jobs=12, stdout=out)
    assert "6000 sandboxes" in out.getvalue()
    assert Sandbox.objects.count() == Acquisition.objects.count() == 6000
    assert Job.objects.count() == 12
    assert Trajectory.objects.count() >= 1000 and TrajectoryPhase.objects.count() > 5000
    assert LearnerStep.objects.exists()
    rollouts = Sandbox.objects.filter(role="rollout", deleted_at__isnull=False)
    lifetimes = sorted(
        rollouts.annotate(life=DurationMs("released_at", "acquired_at")).values_list(
            "life", flat=True
        )
    )
    assert 170_000 < statistics.median(lifetimes) < 230_000  # p50 about 200 s
    assert 380_000 < lifetimes[int(len(lifetimes) * 0.99)] < 540_000  # p99 about 450 s
    grading = Sandbox.objects.filter(role="grading").count()
    assert 1.25 < grading / (6000 - grading) < 1.55  # 1.4 grading sandboxes per rollout
    ready = sorted(
        Sandbox.objects.annotate(r=DurationMs("ready_at", "requested_at")).values_list(
            "r", flat=True
        )
    )
    assert 4_000 < statistics.median(ready) < 7_000  # create-to-Ready p50 about 5 s
    assert Sandbox.objects.filter(address_failures__gt=0).exists()
    per_second: dict[int, int] = {}
    for at in Sandbox.objects.values_list("requested_at", flat=True):
        second = int(at.timestamp())
        per_second[second] = per_second.get(second, 0) + 1
    assert max(per_second.values()) >= BURST  # bursts of 132 creates in one second

    client = Client()
    client.force_login(make_staff())
    for url in ("/", "/operations/", "/training/", "/training/?minutes=44640"):
        assert client.get(url).status_code == 200, url
    busiest = Trajectory.objects.values_list("job_id", flat=True).last()
    path = critical_path(busiest)
    assert path.attribution.per_step
    assert sum(path.attribution.shares.values()) == pytest.approx(1.0)
