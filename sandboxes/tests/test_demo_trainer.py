"""``manage.py demo_trainer`` runs real rollouts over HTTP against a live server."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command

from sandboxes.models import Job, LearnerStep, Sandbox, Trajectory
from sandboxes.tests.api_support import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_demo_trainer_runs_every_rollout_through_the_client_and_drains_its_job(
    controller, live_server
):
    out = io.StringIO()
    call_command(
        "demo_trainer",
        rollouts=4,
        concurrency=2,
        prewarm=2,
        url=live_server.url,
        egress="allow",  # tmp_path is not reachable by the sandbox user: no isolation here
        stdout=out,
        stderr=io.StringIO(),
    )
    text = out.getvalue()
    assert "prewarmed 2/2 warm sandboxes" in text
    summary = re.search(r"demo_trainer job=(\d+) rollouts=4 ok=4 failed=0 warm=(\d+)", text)
    assert summary, text
    assert int(summary.group(2)) >= 2  # the two prewarmed sandboxes were handed out
    job_id = int(summary.group(1))
    assert Job.objects.get(pk=job_id).owner.username == "demo-trainer"
    wait_for(lambda: Job.objects.get(pk=job_id).state == "drained", what="the demo job drained")
    assert set(Sandbox.objects.filter(job_id=job_id).values_list("state", flat=True)) == {"deleted"}


def test_demo_trainer_reports_a_simulated_learner_and_prints_its_critical_path(
    controller, live_server
):
    out = io.StringIO()
    call_command(
        "demo_trainer",
        rollouts=1,
        concurrency=1,
        learner_steps=6,
        learner_scale=0.1,
        url=live_server.url,
        egress="allow",
        stdout=out,
        stderr=io.StringIO(),
    )
    text = out.getvalue()
    line = re.search(r"demo_learner job=(\d+) steps=6 trajectories=(\d+) .*generation=", text)
    assert line, text
    job_id = int(line.group(1))
    assert Trajectory.objects.filter(job_id=job_id).count() == int(line.group(2))
    assert LearnerStep.objects.filter(job_id=job_id).count() == 6
