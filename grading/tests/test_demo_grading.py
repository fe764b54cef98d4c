"""``manage.py demo_trainer --grade-samples`` grades the shipped sample set over HTTP (the
client's ``grade()``/``wait()``) with the grading runner on its own thread, as under
``scripts/serve``."""

from __future__ import annotations

import io
import re

import pytest
from django.core.management import call_command

from grading.models import Grading
from grading.runner import GradingRunner, set_runner
from grading.tests import sample_support as ss

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runner(sample_controller):
    runner = GradingRunner(controller=sample_controller, acquire_timeout_s=60, poll_interval_s=0.2)
    set_runner(runner)
    runner.start()
    yield runner
    runner.stop()
    set_runner(None)


def test_demo_trainer_grades_the_sample_set_live(runner, live_server):
    ss.import_samples()
    out = io.StringIO()
    call_command(
        "demo_trainer",
        rollouts=1,
        concurrency=1,
        url=live_server.url,
        grade_samples="slugs,clamp",
        stdout=out,
        stderr=io.StringIO(),
    )
    text = out.getvalue()
    assert "graded sandman-sample__slugs-1: resolved" in text
    assert "graded sandman-sample__slugs-1 (empty patch): unresolved" in text
    assert "graded sandman-sample__clamp-1: resolved" in text
    line = re.search(r"demo_grading job=(\d+) gradings=3 resolved=2 unresolved=1", text)
    assert line, text
    assert Grading.objects.filter(job_id=int(line.group(1)), state="done").count() == 3
