"""Rollouts through the REST API with the real controller, local provider and execd.

The ``controller`` fixture (``conftest.py``) runs a real Controller on its own loop
thread with a LocalProvider rooted in a tmp dir; every sandbox here is a real execd
process with a real bash, called over HTTP at the address the acquire answered.
Waits are on database state with a deadline (``api_support.wait_for``), never sleeps.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from sandboxes.models import Acquisition, Job, Sandbox
from sandboxes.tests.api_support import api, make_user, row_counts, wait_for
from sandboxes.tests.controller_support import execd

pytestmark = pytest.mark.django_db(transaction=True)

SPEC = {"cpu": "500m", "memory": "256Mi"}


@pytest.fixture
def trainer(controller) -> dict[str, Any]:
    user, token = make_user("trainer")
    client = api(token)
    response = client.post("/api/v1/jobs/", {"name": "rollouts", "egress": "allow"}, format="json")
    assert response.status_code == 201, response.content
    return {"user": user, "token": token, "api": client, "job_id": response.json()["id"]}


def _acquire(trainer: dict[str, Any], **over: Any):
    body = {"image": "sandman/empty", "spec": SPEC, "role": "rollout", "timeout_s": 60, **over}
    return trainer["api"].post(f"/api/v1/jobs/{trainer['job_id']}/acquire/", body, format="json")


def _state(sandbox_id: int) -> str:
    return Sandbox.objects.get(pk=sandbox_id).state


def test_a_rollout_acquires_runs_in_execd_writes_reads_releases_and_ends_deleted(trainer):
    response = _acquire(trainer)
    assert response.status_code == 200, response.content
    got = response.json()
    assert set(got) >= {"sandbox_id", "address", "token", "source", "wait_ms", "queue_ms"}
    assert got["source"] == "created"
    assert got["wait_ms"] >= got["queue_ms"] >= 0
    assert _state(got["sandbox_id"]) == "in_use"

    ran = execd(got["address"], got["token"], "/exec", {"command": "cd /tmp && echo $((6*7))"})
    assert ran["exit_code"] == 0 and ran["output"].strip() == "42"
    again = execd(got["address"], got["token"], "/exec", {"command": "pwd"})
    assert again["output"].strip() == "/tmp"  # the shell is persistent across calls

    content = "line one\r\nline two, no final newline"
    written = execd(
        got["address"], got["token"], "/files/write", {"path": "notes.txt", "content": content}
    )
    assert written["sha256"] == hashlib.sha256(content.encode()).hexdigest()
    back = execd(got["address"], got["token"], "/files/read", {"path": "notes.txt"})
    assert back["sha256"] == written["sha256"]

    released = trainer["api"].post(
        f"/api/v1/sandboxes/{got['sandbox_id']}/release/",
        {"outcome": {"verdict": "pass"}},
        format="json",
    )
    assert released.status_code == 200, released.content
    assert released.json() == {"sandbox_id": got["sandbox_id"], "released": True}
    wait_for(lambda: _state(got["sandbox_id"]) == "deleted", what="the sandbox to be deleted")
    acquisition = Acquisition.objects.get(sandbox_id=got["sandbox_id"])
    assert (acquisition.outcome, acquisition.source) == ("ok", "created")


def test_a_second_release_is_a_409_and_changes_nothing(trainer):
    got = _acquire(trainer).json()
    url = f"/api/v1/sandboxes/{got['sandbox_id']}/release/"
    assert trainer["api"].post(url, {}, format="json").status_code == 200
    before = row_counts()
    state_before = _state(got["sandbox_id"])
    second = trainer["api"].post(url, {}, format="json")
    assert second.status_code == 409, second.content
    assert second.json()["error"] == "already_released"
    assert row_counts()["sandboxes"] == before["sandboxes"]
    assert row_counts()["acquisitions"] == before["acquisitions"]
    assert _state(got["sandbox_id"]) in {state_before, "deleting", "deleted"}


def test_an_unknown_image_is_a_400_and_creates_nothing(trainer):
    before = row_counts()
    response = _acquire(trainer, image="no/such-image")
    assert response.status_code == 400, response.content
    assert response.json()["error"] == "unknown_image"
    assert row_counts() == before


def test_prewarm_answers_202_and_warm_sandboxes_appear(trainer):
    job_id = trainer["job_id"]
    response = trainer["api"].post(
        f"/api/v1/jobs/{job_id}/prewarm/",
        {"keys": [{"image": "sandman/empty", "spec": SPEC, "count": 2}]},
        format="json",
    )
    assert response.status_code == 202, response.content

    def warm() -> int:
        return trainer["api"].get(f"/api/v1/jobs/{job_id}/").json()["counts"]["warm"]

    wait_for(lambda: warm() >= 2, what="two warm sandboxes")
    got = _acquire(trainer).json()
    assert got["source"] == "warm"


def test_drain_answers_202_and_every_sandbox_of_the_job_ends_deleted(trainer):
    job_id = trainer["job_id"]
    held = _acquire(trainer).json()
    trainer["api"].post(
        f"/api/v1/jobs/{job_id}/prewarm/",
        {"keys": [{"image": "sandman/empty", "spec": SPEC, "count": 1}]},
        format="json",
    )
    wait_for(
        lambda: Sandbox.objects.filter(job_id=job_id, state="ready").exists(), what="a warm sandbox"
    )
    response = trainer["api"].post(f"/api/v1/jobs/{job_id}/drain/", {}, format="json")
    assert response.status_code == 202, response.content

    def all_deleted() -> bool:
        states = set(Sandbox.objects.filter(job_id=job_id).values_list("state", flat=True))
        return states == {"deleted"}

    wait_for(all_deleted, what="every sandbox of the job to be deleted")
    wait_for(lambda: Job.objects.get(pk=job_id).state == "drained", what="the job to be drained")
    assert Sandbox.objects.get(pk=held["sandbox_id"]).state == "deleted"
    after = _acquire(trainer)
    assert after.status_code == 409 and after.json()["error"] == "job_not_active"
