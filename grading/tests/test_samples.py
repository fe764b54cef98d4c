"""The shipped sample task set: each planted task behaves as ``sample_tasks/*/task.json`` says,
under grading (real execd, local backend, real git, patch and pytest, PostgreSQL).

The images are built by ``grading.samples`` (what ``manage.py sample_tasks`` runs); the
suites run the image's own ``python3 -m pytest``. Each grading goes through REST and the
grading runner (``run_once``: one grading to its verdict), in fresh grading sandboxes.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.core.management import call_command

from grading import samples
from grading.harness import grade_patch
from grading.runner import GradingRunner
from grading.tests import harness_support as hs
from grading.tests import sample_support as ss
from grading.verdicts import Verdict
from sandboxes.tests.api_support import api, make_job

pytestmark = pytest.mark.django_db(transaction=True)


def _grade(runner: GradingRunner, token: str, job: Any, task: Any, **body: Any) -> dict[str, Any]:
    response = api(token).post(
        "/api/v1/gradings/", {"job": job.pk, "task": task.instance_id, **body}, format="json"
    )
    assert response.status_code == 202, response.content
    assert runner.run_once() is True
    got = api(token).get(f"/api/v1/gradings/{response.json()['id']}/")
    assert got.status_code == 200
    return got.json()


@pytest.fixture
def tasks(sample_controller) -> dict[str, Any]:
    return ss.import_samples()


@pytest.fixture
def runner(sample_controller) -> GradingRunner:
    return GradingRunner(controller=sample_controller, acquire_timeout_s=60)


def test_the_shipped_jsonl_is_what_the_build_command_produces(tmp_path, sample_images):
    built = samples.build_all(tmp_path)
    assert samples.JSONL_PATH.read_text(encoding="utf-8") == samples.jsonl_text(built)
    assert [b.base_commit for b in built] == [
        line["base_commit"] for line in samples.shipped_lines()
    ]
    call_command("sample_tasks", images_dir=str(tmp_path / "again"))  # raises on a mismatch
    assert (tmp_path / "again" / "sandman-sample" / "slugs" / ".git").is_dir()


def test_the_normal_task_resolves_with_its_reference_and_not_with_the_empty_patch(
    tasks, runner, grader
):
    job = make_job(grader[0], egress="deny")
    task = tasks["slugs"]
    fixed = _grade(runner, grader[1], job, task, patch=task.patch)
    assert fixed["verdict"] == "resolved", fixed
    empty = _grade(runner, grader[1], job, task, patch="")
    assert empty["verdict"] == "unresolved", empty
    assert empty["tests"] == {task.fail_to_pass[0]: "FAILED", task.pass_to_pass[0]: "PASSED"}


def test_the_network_task_resolves_with_egress_allowed_and_not_when_denied(tasks, runner, grader):
    task = tasks["pkgindex"]
    with ss.package_index():
        allowed = _grade(
            runner, grader[1], make_job(grader[0], egress="allow"), task, patch=task.patch
        )
        denied = _grade(
            runner, grader[1], make_job(grader[0], egress="deny"), task, patch=task.patch
        )
    assert allowed["verdict"] == "resolved", allowed
    assert denied["verdict"] == "unresolved", denied
    assert denied["tests"][task.fail_to_pass[0]] == "FAILED"
    assert denied["tests"][task.pass_to_pass[0]] == "PASSED"


def test_the_task_whose_tests_do_not_check_the_fix_passes_with_the_empty_patch(
    tasks, runner, grader
):
    job = make_job(grader[0], egress="deny")
    empty = _grade(runner, grader[1], job, tasks["clamp"], patch="")
    assert empty["verdict"] == "resolved", empty  # why preflight must reject it


def test_a_conftest_that_makes_the_tests_pass_is_left_out_by_capture(tasks, runner, grader):
    """The cheat works in the rollout sandbox; captured and graded, it is the agent's change
    only (no conftest.py), so it is unresolved."""
    job = make_job(grader[0], egress="deny")
    task = tasks["temperature"]
    box = runner.controller.acquire(
        job_id=job.pk,
        image=task.image,
        base_commit=task.base_commit,
        role="rollout",
        timeout_s=60,
        **hs.SPEC,
    )
    cheat = (
        "printf 'import temperature\\n\\ntemperature.c_to_f = lambda c: c * 9 / 5 + 32\\n'"
        " > conftest.py && printf '\\n# looked at it\\n' >> temperature.py"
    )
    official = task.test_patch

    async def agent(execd):
        assert (await execd.exec(cheat, timeout_s=30)).exit_code == 0
        await execd.write(".git/official.patch", official)
        assert (await execd.exec("git apply .git/official.patch", timeout_s=30)).exit_code == 0
        run = await execd.exec(f"{samples.SUITE_COMMAND} 2>&1", timeout_s=60)
        assert (await execd.exec("git checkout -q -- tests", timeout_s=30)).exit_code == 0
        return run.output

    assert f"PASSED {task.fail_to_pass[0]}" in hs.with_execd(box.address, box.token, agent)
    captured = api(grader[1]).post(
        f"/api/v1/sandboxes/{box.sandbox_id}/capture/", {"task": task.instance_id}, format="json"
    )
    assert captured.status_code == 201, captured.content
    assert "conftest.py" not in captured.json()["patch"]
    assert "temperature.py" in captured.json()["patch"]
    graded = _grade(runner, grader[1], job, task, capture_id=captured.json()["id"])
    assert graded["verdict"] == "unresolved", graded
    assert graded["tests"][task.fail_to_pass[0]] == "FAILED"


def test_the_time_zone_task_holds_in_its_declared_zone_and_fails_elsewhere_with_the_fix(
    tasks, runner, grader
):
    """§4.5: the task declares time_zone Etc/UTC. Where the probe reads that zone the reference
    resolves; in Asia/Tokyo the same fix fails its tests — which is why a sandbox whose zone
    contradicts the declaration is refused (no_verdict), never scored."""
    job = make_job(grader[0], egress="deny")
    task = tasks["weeks"]
    graded = _grade(runner, grader[1], job, task, patch=task.patch)
    [check] = graded["attempts"][0]["checks"]
    assert (check["field"], check["declared"]) == ("time_zone", "Etc/UTC")
    if check["read"] == "Etc/UTC":
        assert graded["verdict"] == "resolved", graded
    else:  # a host in another zone: refused with both values, never a 0
        assert graded["verdict"] == "no_verdict", graded
        assert {a["outcome"] for a in graded["attempts"]} == {"probe_refused"}
    box = runner.controller.acquire(
        job_id=job.pk,
        image=task.image,
        base_commit=task.base_commit,
        role="grading",
        timeout_s=60,
        **hs.SPEC,
    )
    tokyo = [
        {"name": "unit", "command": f"TZ=Asia/Tokyo {samples.SUITE_COMMAND}", "time_limit_s": 60}
    ]
    result = hs.with_execd(
        box.address,
        box.token,
        lambda execd: grade_patch(
            execd,
            base_commit=task.base_commit,
            patch=task.patch,
            test_patch=task.test_patch,
            fail_to_pass=task.fail_to_pass,
            pass_to_pass=task.pass_to_pass,
            suites=tokyo,
            excluded=task.excluded_test_config,
        ),
    )
    assert result.decision.verdict is Verdict.UNRESOLVED
    assert set(result.decision.fail_to_pass_not_passed) == set(task.fail_to_pass)


def test_the_suite_over_its_short_time_limit_ends_no_verdict_never_a_zero(tasks, runner, grader):
    job = make_job(grader[0], egress="deny")
    task = tasks["primes"]
    assert task.suites[0]["time_limit_s"] == 3
    graded = _grade(runner, grader[1], job, task, patch=task.patch)
    assert graded["verdict"] == "no_verdict", graded
    assert [a["outcome"] for a in graded["attempts"]] == ["infrastructure"] * 3
    assert all("did not finish within 3 s" in a["detail"] for a in graded["attempts"])
    assert graded["tests"] == {}
