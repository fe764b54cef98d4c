"""The grading admin: tasks and captures read-only, a task set made in the admin, retire."""

from __future__ import annotations

import pytest
from django.utils import timezone

from grading import services
from grading.apis import TaskCreateApi
from grading.models import Task, TaskSet
from grading.tests.support import instance

pytestmark = pytest.mark.django_db


def _task(instance_id: str = "calc-1") -> Task:
    data = TaskCreateApi.InputSerializer(data=instance(instance_id=instance_id))
    assert data.is_valid(), data.errors
    return services.task_create(created_by=None, now=timezone.now(), fields=data.validated_data)


def test_tasks_are_listed_filtered_and_shown_read_only(admin_client):
    task = _task()
    listing = admin_client.get("/admin/grading/task/?state__exact=active")
    assert listing.status_code == 200 and b"calc-1" in listing.content
    page = admin_client.get(f"/admin/grading/task/{task.pk}/change/")
    assert page.status_code == 200 and b"Save" not in page.content
    assert admin_client.get("/admin/grading/task/add/").status_code == 403


def test_the_retire_action_goes_through_the_transition_service(admin_client):
    task = _task()
    response = admin_client.post(
        "/admin/grading/task/", {"action": "retire", "_selected_action": [task.pk]}
    )
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.state == "retired" and task.state_changed_at is not None


def test_a_task_set_made_in_the_admin_is_stamped(admin_client, admin_user):
    task = _task()
    response = admin_client.post(
        "/admin/grading/taskset/add/", {"name": "small", "description": "", "tasks": [task.pk]}
    )
    assert response.status_code == 302, response.content
    group = TaskSet.objects.get(name="small")
    assert group.created_by == admin_user and list(group.tasks.all()) == [task]
    assert admin_client.get("/admin/grading/patchcapture/").status_code == 200


def test_gradings_are_listed_filtered_by_verdict_reason_and_job_and_read_only(admin_client):
    from grading.models import Grading
    from sandboxes.tests.api_support import make_job, make_user

    task = _task()
    job = make_job(make_user("trainer")[0])
    services.grading_create(
        job=job,
        task=task,
        patch="",
        capture=None,
        suite_names=None,
        created_by=None,
        now=timezone.now(),
    )
    grading = Grading.objects.get()
    for query in ("verdict__exact=", "reason_kind=no_verdict", f"job__id__exact={job.pk}"):
        assert admin_client.get(f"/admin/grading/grading/?{query}").status_code == 200
    page = admin_client.get(f"/admin/grading/grading/{grading.pk}/change/")
    assert page.status_code == 200 and b"Save" not in page.content


def test_certifications_are_listed_and_shown_read_only(admin_client):
    from grading.models import Certification
    from sandboxes.tests.api_support import make_job, make_user

    task = _task()
    group = services.task_set_create(
        created_by=None, now=timezone.now(), name="set-1", instance_ids=[task.instance_id]
    )
    job = make_job(make_user("trainer")[0])
    cert = services.certification_start(
        task_set=group, job=job, created_by=None, now=timezone.now()
    )
    assert Certification.objects.count() == 1
    listing = admin_client.get("/admin/grading/certification/?state__exact=running")
    assert (
        listing.status_code == 200 and b"set-1" in listing.content and b"0 of 1" in listing.content
    )
    page = admin_client.get(f"/admin/grading/certification/{cert.pk}/change/")
    assert page.status_code == 200 and b"Save" not in page.content
    assert cert.config_hash.encode() in page.content
    assert admin_client.get("/admin/grading/certification/add/").status_code == 403
    filtered = admin_client.get("/admin/grading/grading/?preflight_kind__exact=reference")
    assert filtered.status_code == 200
