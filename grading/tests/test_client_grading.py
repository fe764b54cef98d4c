"""The trainer client's ``grade()`` and ``wait()`` against a live server, with the grading
runner running on its own thread (as the service process runs it) and woken by the create."""

from __future__ import annotations

import pytest

from grading.runner import GradingRunner, set_runner
from grading.tests import harness_support as hs
from grading.tests.support import instance
from sandboxes.client import Client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def runner(grading_controller):
    runner = GradingRunner(controller=grading_controller, acquire_timeout_s=60, poll_interval_s=30)
    set_runner(runner)
    runner.start()
    yield runner
    runner.stop()
    set_runner(None)


def test_grade_then_wait_returns_the_verdict(runner, live_server, grader, grading_job, repo):
    with Client(live_server.url, grader[1]) as client:
        body = instance(
            instance_id="calc-1",
            base_commit=repo.base_commit,
            patch=repo.fix,
            test_patch=repo.test_patch,
            image=repo.image,
            FAIL_TO_PASS=hs.F2P,
            PASS_TO_PASS=hs.P2P,
            suites=[{"name": "unit", "command": hs.PYTEST, "time_limit_s": 120}],
        )
        client._call("POST", "/api/v1/tasks/", body)
        job = client.get_job(grading_job.pk)
        fixed = job.grade(task="calc-1", patch=repo.fix)
        empty = job.grade(task="calc-1", patch="")
        # poll_interval_s=30: only the create's wake-up can make these finish in time.
        assert fixed.wait(timeout_s=25, poll_s=0.05).verdict == "resolved"
        assert empty.wait(timeout_s=25, poll_s=0.05).verdict == "unresolved"
        assert fixed.data["tests"][hs.F2P[0]] == "PASSED"
