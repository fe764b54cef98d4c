"""Preflight and certification end to end on the sample task set: REST → preflight gradings
graded by the runner under the job's configuration (real execd, local backend, git, pytest)
→ the certification record → a job's gradings for the task set gated by it (409s).
"""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import call_command

from grading import certify, selectors
from grading.models import Certification, Grading
from grading.runner import GradingRunner
from grading.services import task_set_create
from grading.tests import sample_support as ss
from sandboxes.tests.api_support import api, make_job, make_user

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def tasks(sample_controller) -> dict[str, Any]:
    return ss.import_samples()


def _set(name: str, *samples: str) -> Any:
    from django.utils import timezone

    ids = [f"sandman-sample__{s}-1" for s in samples]
    return task_set_create(created_by=None, now=timezone.now(), name=name, instance_ids=ids)


def _run_until_done(runner: GradingRunner, cert_id: int, limit: int = 20) -> dict[str, Any]:
    for _ in range(limit):
        runner.run_once()
        cert = Certification.objects.get(pk=cert_id)
        if cert.state == "done":
            return cert.results
    raise AssertionError(f"certification {cert_id} not done after {limit} runs")


def test_preflight_admits_the_normal_task_and_rejects_the_one_whose_tests_miss_the_fix(
    sample_controller, tasks, grader
):
    """§4.3: the reference resolves twice and the empty patch fails twice → admitted; the
    planted clamp task's empty patch resolves → rejected, early stopping (3 gradings)."""
    user, token = grader
    job = make_job(user, egress="deny")
    group = _set("two", "slugs", "clamp")
    started = api(token).post(
        f"/api/v1/task-sets/{group.pk}/preflight/", {"job": job.pk}, format="json"
    )
    assert started.status_code == 202, started.content
    cert_id = started.json()["id"]
    assert started.json()["state"] == "running"
    _run_until_done(GradingRunner(controller=sample_controller, acquire_timeout_s=60), cert_id)
    data = api(token).get(f"/api/v1/certifications/{cert_id}/").json()
    slugs, clamp = (
        data["results"]["sandman-sample__slugs-1"],
        data["results"]["sandman-sample__clamp-1"],
    )
    assert slugs["admitted"] is True
    assert [(v["kind"], v["verdict"]) for v in slugs["verdicts"]] == [
        ("reference", "resolved"),
        ("reference", "resolved"),
        ("empty", "unresolved"),
        ("empty", "unresolved"),
    ]
    assert clamp["admitted"] is False
    assert clamp["reason"] == "empty patch resolved: the tests do not check the fix"
    assert [v["kind"] for v in clamp["verdicts"]] == ["reference", "reference", "empty"]
    assert Grading.objects.filter(certification_id=cert_id).count() == 7
    assert data["admitted"] == ["sandman-sample__slugs-1"]
    assert data["config"] == selectors.job_config(job)
    assert data["config_hash"] == certify.canonical_hash(data["config"])
    assert data["chain"] == certify.chain(data["config_hash"], [slugs["digest"]])
    assert slugs["digest"] == selectors.task_digest_of(tasks["slugs"])

    def grade(job_id: int, task: str, token: str = token, **extra: Any):
        body = {"job": job_id, "task": task, "patch": "", "task_set": group.pk, **extra}
        return api(token).post("/api/v1/gradings/", body, format="json")

    before = Grading.objects.count()
    assert grade(job.pk, "sandman-sample__slugs-1").status_code == 202
    rejected = grade(job.pk, "sandman-sample__clamp-1")
    assert rejected.status_code == 409 and rejected.json()["error"] == "not_certified"
    assert "do not check the fix" in rejected.json()["detail"]
    other = make_job(user, egress="allow")
    differs = grade(other.pk, "sandman-sample__slugs-1")
    assert differs.status_code == 409
    assert "egress: certified 'deny', job 'allow'" in differs.json()["detail"]
    uncertified = _set("uncertified", "slugs")
    none = grade(job.pk, "sandman-sample__slugs-1", task_set=uncertified.pk)
    assert none.status_code == 409 and "no certification" in none.json()["detail"]
    outside = grade(job.pk, "sandman-sample__weeks-1")
    assert outside.status_code == 400 and "not in task set" in outside.json()["detail"]
    assert Grading.objects.count() == before + 1


def test_manage_py_preflight_grades_with_a_progress_bar_and_stores_the_record(
    sample_controller, sandbox_root, tasks, grader, settings
):
    settings.SANDMAN_SANDBOX_ROOT = sandbox_root
    job = make_job(grader[0], egress="deny")
    _set("unchecked", "clamp")
    out, err = io.StringIO(), io.StringIO()
    call_command("preflight", "unchecked", job=job.pk, timeout=300, stdout=out, stderr=err)
    cert = Certification.objects.get()
    assert cert.state == "done" and cert.admitted == []
    assert cert.chain == certify.chain(cert.config_hash, [])
    assert "[" + "#" * 30 + "] 1/1 tasks decided, 0 admitted, 1 rejected" in err.getvalue()
    assert "REJECTED  sandman-sample__clamp-1: empty patch resolved" in out.getvalue()


def test_preflight_bad_requests_store_nothing(sample_controller, tasks, grader):
    user, token = grader
    job = make_job(user)
    group = _set("one", "slugs")
    _, other_token = make_user("mallory")
    cases = [
        (other_token, group.pk, {"job": job.pk}, 404),  # someone else's job
        (token, 99999, {"job": job.pk}, 404),  # unknown task set
        (token, group.pk, {"job": job.pk, "jb": 1}, 400),  # a typo
        (token, group.pk, {}, 400),
    ]
    for who, set_id, body, status in cases:
        response = api(who).post(f"/api/v1/task-sets/{set_id}/preflight/", body, format="json")
        assert response.status_code == status, (body, response.content)
        assert response.json()["error"] and response.json()["detail"]
    empty = _set("empty", "primes")
    from django.utils import timezone

    from grading.services import task_retire

    task_retire(task=tasks["primes"], now=timezone.now())
    response = api(token).post(
        f"/api/v1/task-sets/{empty.pk}/preflight/", {"job": job.pk}, format="json"
    )
    assert response.status_code == 400 and "no active task" in response.json()["detail"]
    assert Certification.objects.count() == 0 and Grading.objects.count() == 0


def test_a_task_retired_mid_preflight_is_rejected_and_the_runner_keeps_going(
    sample_controller, tasks, grader
):
    from django.utils import timezone

    from grading import services

    job = make_job(grader[0], egress="deny")
    group = _set("retiring", "slugs")
    cert = services.certification_start(
        task_set=group, job=job, created_by=None, now=timezone.now()
    )
    runner = GradingRunner(controller=sample_controller, acquire_timeout_s=60)
    assert runner.run_once() is True  # the first reference grading
    services.task_retire(task=tasks["slugs"], now=timezone.now())
    results = _run_until_done(runner, cert.pk)
    result = results["sandman-sample__slugs-1"]
    assert result["admitted"] is False
    assert result["reason"].startswith("preflight could not grade it again")
    assert [v["verdict"] for v in result["verdicts"]] == ["resolved"]
