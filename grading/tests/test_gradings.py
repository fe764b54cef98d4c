"""Gradings end to end: REST → stored → the runner grades in fresh grading sandboxes (real
execd, git, patch and pytest) → the verdict over REST; retries, no_verdict and restarts.

The runner is driven with ``run_once`` (one grading to its verdict) so each test knows when
the work is done without waiting on a thread; its clock is a parameter for the restart test.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from grading import services
from grading.models import Grading, Task
from grading.runner import GradingRunner
from grading.tests import harness_support as hs
from grading.tests.support import instance
from sandboxes.models import Sandbox
from sandboxes.tests.api_support import api

pytestmark = pytest.mark.django_db(transaction=True)


def _task(token: str, repo: hs.TaskRepo, *, command: str = hs.PYTEST, **over: Any) -> None:
    body = instance(
        instance_id="calc-1",
        base_commit=repo.base_commit,
        patch=repo.fix,
        test_patch=repo.test_patch,
        image=repo.image,
        FAIL_TO_PASS=hs.F2P,
        PASS_TO_PASS=hs.P2P,
        suites=[{"name": "unit", "command": command, "time_limit_s": 120}],
        **{"conditions": {"cpu_quota": "500m", "memory_limit": "256Mi"}, **over},
    )
    response = api(token).post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 201, response.content


def _grade(token: str, job_id: int, **body: Any) -> int:
    response = api(token).post(
        "/api/v1/gradings/", {"job": job_id, "task": "calc-1", **body}, format="json"
    )
    assert response.status_code == 202, response.content
    assert set(response.json()) == {"id"}
    return response.json()["id"]


def _get(token: str, grading_id: int) -> dict[str, Any]:
    response = api(token).get(f"/api/v1/gradings/{grading_id}/")
    assert response.status_code == 200, response.content
    return response.json()


def test_the_reference_patch_is_resolved_in_a_fresh_grading_sandbox(
    grading_controller, grading_job, grader, repo
):
    token = grader[1]
    _task(token, repo)
    grading_id = _grade(token, grading_job.pk, patch=repo.fix)
    assert _get(token, grading_id)["state"] == "queued"
    runner = GradingRunner(controller=grading_controller, acquire_timeout_s=60)
    assert runner.run_once() is True
    data = _get(token, grading_id)
    assert (data["state"], data["verdict"], data["reason"]) == ("done", "resolved", "resolved")
    assert data["tests"] == {hs.F2P[0]: "PASSED", hs.P2P[0]: "PASSED"}
    assert data["apply_step"] == "git apply --verbose"
    [attempt] = data["attempts"]
    assert attempt["outcome"] == "resolved" and attempt["source"] == "created"
    box = Sandbox.objects.get(pk=attempt["sandbox_id"])
    assert box.role == "grading" and box.state in ("deleting", "deleted", "released")
    assert runner.run_once() is False  # nothing else waits


def test_an_empty_patch_and_one_that_does_not_apply_are_valid_zeros_not_retried(
    grading_controller, grading_job, grader, repo
):
    token = grader[1]
    _task(token, repo)
    empty = _grade(token, grading_job.pk, patch="")
    stale = _grade(token, grading_job.pk, patch=repo.fix.replace("a - b", "a * b"))
    runner = GradingRunner(controller=grading_controller, acquire_timeout_s=60)
    assert runner.run_once() and runner.run_once()
    got_empty, got_stale = _get(token, empty), _get(token, stale)
    assert got_empty["verdict"] == "unresolved" and got_empty["reason"].startswith("tests_failed")
    assert got_empty["tests"][hs.F2P[0]] == "FAILED"
    assert got_stale["verdict"] == "unresolved"
    assert got_stale["reason"].startswith("patch_did_not_apply")
    assert [len(got_empty["attempts"]), len(got_stale["attempts"])] == [1, 1]


def test_a_killed_grading_sandbox_is_retried_on_another_then_graded_never_zero(
    grading_controller, grading_job, grader, repo, tmp_path: Path
):
    token = grader[1]
    marker = tmp_path / "killed-once"
    tmp_path.chmod(0o777)
    # The first attempt kills its own execd mid-suite; the retry runs the tests.
    kill_once = f"if [ ! -e {marker} ]; then touch {marker}; kill -9 $PPID; else {hs.PYTEST}; fi"
    _task(token, repo, command=kill_once)
    grading_id = _grade(token, grading_job.pk, patch=repo.fix)
    GradingRunner(controller=grading_controller, acquire_timeout_s=60).run_once()
    data = _get(token, grading_id)
    assert data["verdict"] == "resolved", data
    first, second = data["attempts"]
    assert first["outcome"] == "infrastructure" and "execd" in first["detail"]
    assert second["outcome"] == "resolved"
    assert first["sandbox_id"] != second["sandbox_id"]


def test_a_grading_whose_sandboxes_keep_dying_ends_no_verdict_never_unresolved(
    grading_controller, grading_job, grader, repo
):
    token = grader[1]
    _task(token, repo, command="kill -9 $PPID")
    grading_id = _grade(token, grading_job.pk, patch=repo.fix)
    GradingRunner(controller=grading_controller, acquire_timeout_s=60).run_once()
    data = _get(token, grading_id)
    assert data["verdict"] == "no_verdict" and data["reason"].startswith(
        "no_verdict: 3 attempts failed"
    )
    assert [a["outcome"] for a in data["attempts"]] == ["infrastructure"] * 3
    assert len({a["sandbox_id"] for a in data["attempts"]}) == 3
    assert data["tests"] == {}


def test_a_restart_mid_grading_retries_it_after_the_lease_and_never_scores_it(
    grading_controller, grading_job, grader, repo
):
    token = grader[1]
    _task(token, repo)
    grading_id = _grade(token, grading_job.pk, patch=repo.fix)
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    # Runner A claims the grading, starts an attempt, and its process dies.
    claimed = services.grading_claim(runner="A", now=t0, lease_s=100)
    assert claimed is not None and claimed.pk == grading_id
    services.grading_attempt_start(
        grading=claimed, sandbox_id=None, source="created", acquire_ms=1.0, now=t0, lease_s=100
    )
    now = [t0 + dt.timedelta(seconds=50)]
    runner_b = GradingRunner(controller=grading_controller, clock=lambda: now[0], name="B")
    assert runner_b.run_once() is False  # A's lease still holds: B leaves it alone
    assert Grading.objects.get(pk=grading_id).state == "running"
    now[0] = t0 + dt.timedelta(seconds=101)
    assert runner_b.run_once() is True
    data = _get(token, grading_id)
    assert data["verdict"] == "resolved"
    assert [a["outcome"] for a in data["attempts"]] == ["lost", "resolved"]


def test_every_attempt_records_its_probe_and_a_contradicting_sandbox_is_refused(
    grading_controller, grading_job, grader, repo
):
    """§4.5: a declared time zone the sandboxes do not have refuses each of them (both values
    recorded); with no other sandbox the grading ends no_verdict, never a 0."""
    token = grader[1]
    _task(token, repo)
    ok = _grade(token, grading_job.pk, patch=repo.fix)
    runner = GradingRunner(controller=grading_controller, acquire_timeout_s=60)
    runner.run_once()
    [attempt] = _get(token, ok)["attempts"]
    assert {"egress", "time_zone", "cpu_quota"} <= set(attempt["probe"])
    assert {c["field"] for c in attempt["checks"]} == {"cpu_quota_millis", "memory_limit_bytes"}
    assert all(c["outcome"] != "contradiction" for c in attempt["checks"])
    Grading.objects.all().delete()
    Task.objects.all().delete()
    _task(token, repo, conditions={"time_zone": "Pacific/Chatham"})
    refused = _grade(token, grading_job.pk, patch=repo.fix)
    runner.run_once()
    data = _get(token, refused)
    assert data["verdict"] == "no_verdict"
    assert [a["outcome"] for a in data["attempts"]] == ["probe_refused"] * 3
    check = data["attempts"][0]["checks"][0]
    assert (check["field"], check["declared"], check["outcome"]) == (
        "time_zone",
        "Pacific/Chatham",
        "contradiction",
    )
    assert check["read"] and "read" in data["attempts"][0]["detail"]
