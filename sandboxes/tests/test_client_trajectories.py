"""The trainer client's ``report_trajectories`` and ``report_steps`` against a live server."""

from __future__ import annotations

from typing import Any

import pytest

from sandboxes.client import Client, SandmanClientError
from sandboxes.models import LearnerStep, Trajectory
from sandboxes.tests.api_support import make_user

pytestmark = pytest.mark.django_db(transaction=True)

T0 = 1_780_000_000.0


@pytest.fixture
def client(live_server) -> Any:
    _, token = make_user("trainer")
    with Client(live_server.url, token) as c:
        yield c


def test_the_client_reports_trajectories_and_steps_and_a_resend_is_all_duplicates(client):
    job = client.job(name="learner")
    trajectories = [
        {
            "id": f"t{i}",
            "slot": i % 4,
            "group": f"g{i // 4}",
            "start": T0 + i,
            "end": T0 + i + 50,
            "failed": False,
            "sandbox_ids": [],
            "phases": [{"kind": "generation", "start": T0 + i, "end": T0 + i + 50}],
        }
        for i in range(12_000)
    ]
    assert job.report_trajectories(trajectories) == {
        "received": 12_000,
        "stored": 12_000,
        "duplicates": 0,
    }
    assert job.report_trajectories(trajectories[:3])["duplicates"] == 3
    steps = [
        {"step": 1, "wait_start": T0, "wait_end": T0 + 53, "train_end": T0 + 60, "groups": ["g0"]}
    ]
    assert job.report_steps(steps) == {"received": 1, "stored": 1, "duplicates": 0}
    assert Trajectory.objects.filter(job_id=job.id).count() == 12_000
    assert LearnerStep.objects.filter(job_id=job.id).count() == 1


def test_a_refused_batch_raises_with_the_index_of_the_bad_record(client):
    job = client.job(name="learner")
    steps = [
        {"step": 1, "wait_start": T0, "wait_end": T0 + 5, "train_end": T0 + 9, "groups": ["g"]},
        {"step": 2, "wait_start": T0, "wait_end": T0 - 5, "train_end": T0 + 9, "groups": ["g"]},
    ]
    with pytest.raises(SandmanClientError) as refused:
        job.report_steps(steps)
    assert refused.value.status == 400
    assert refused.value.body["extra"]["index"] == 1
    assert LearnerStep.objects.count() == 0
