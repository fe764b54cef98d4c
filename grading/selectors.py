"""Reads of the grading app for the REST API and the admin: tasks and task sets.

Rules a reader must not break: no side effects; tasks are a catalogue every authenticated
trainer may read (they hold no secrets), so there is no ownership filter on them. Gradings
belong to jobs and are seen only by the job's owner (staff see all); anything else is a 404.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db.models import QuerySet

from grading import certify
from grading.errors import NotCertified
from grading.models import Certification, Grading, PatchCapture, Task, TaskSet
from grading.states import CertificationState
from sandman_site.errors import InvalidInput, NotFound


def task_list(*, task_set: str | None = None, state: str | None = None) -> QuerySet[Task]:
    qs = Task.objects.order_by("instance_id")
    if task_set is not None:
        qs = qs.filter(task_sets__name=task_set)
    if state is not None:
        qs = qs.filter(state=state)
    return qs


def task_get(*, instance_id: str) -> Task:
    try:
        return Task.objects.get(instance_id=instance_id)
    except Task.DoesNotExist as exc:
        raise NotFound(f"unknown task {instance_id!r}.") from exc


def task_set_list() -> QuerySet[TaskSet]:
    return TaskSet.objects.order_by("name").prefetch_related("tasks")


def task_set_get(*, task_set_id: int) -> TaskSet:
    try:
        return TaskSet.objects.prefetch_related("tasks").get(pk=task_set_id)
    except TaskSet.DoesNotExist as exc:
        raise NotFound(f"unknown task set {task_set_id}.") from exc


def grading_get_for_user(*, user: Any, grading_id: int) -> Grading:
    """One grading if the caller may see its job (the sandboxes app's rule); else 404."""
    qs = Grading.objects.select_related("task")
    if not (getattr(user, "is_staff", False)):
        qs = qs.filter(job__owner=user)
    try:
        return qs.get(pk=grading_id)
    except Grading.DoesNotExist as exc:
        raise NotFound(f"grading {grading_id} not found.") from exc


def capture_get_for_user(*, user: Any, capture_id: int) -> PatchCapture:
    qs = PatchCapture.objects.all()
    if not getattr(user, "is_staff", False):
        qs = qs.filter(created_by=user)
    try:
        return qs.get(pk=capture_id)
    except PatchCapture.DoesNotExist as exc:
        raise NotFound(f"capture {capture_id} not found.") from exc


def certification_get_for_user(*, user: Any, certification_id: int) -> Certification:
    """One certification if the caller may see its job (staff see all); else 404."""
    qs = Certification.objects.select_related("task_set")
    if not getattr(user, "is_staff", False):
        qs = qs.filter(job__owner=user)
    try:
        return qs.get(pk=certification_id)
    except Certification.DoesNotExist as exc:
        raise NotFound(f"certification {certification_id} not found.") from exc


def certification_for_grading(
    *, task_set: TaskSet, task: Task, config: dict[str, Any], task_digest: str
) -> Certification:
    """The newest finished certification of ``task_set`` whose configuration is ``config``
    and which admitted ``task`` as it is now; otherwise ``NotCertified`` naming what differs."""
    if not task_set.tasks.filter(pk=task.pk).exists():
        raise InvalidInput(f"task {task.instance_id!r} is not in task set {task_set.name!r}.")
    config_hash = certify.canonical_hash(config)
    certs = Certification.objects.filter(task_set=task_set).order_by("-pk")
    cert = certs.filter(config_hash=config_hash, state=CertificationState.DONE).first()
    if cert is None:
        running = certs.filter(config_hash=config_hash).first()
        latest = certs.filter(state=CertificationState.DONE).first()
        if running is not None:
            why = f"its certification {running.pk} for this configuration is still running"
        elif latest is not None:
            diff = "; ".join(certify.config_differences(latest.config, config))
            why = f"its latest certification ({latest.pk}) is for another configuration: {diff}"
        else:
            why = "it has no certification; run preflight for this job first"
        raise NotCertified(
            f"task set {task_set.name!r} is not certified for job configuration: {why}.",
            {"task_set": task_set.pk, "config": config},
        )
    result = cert.results.get(task.instance_id)
    if result is None:
        raise NotCertified(
            f"task {task.instance_id!r} joined task set {task_set.name!r} after certification "
            f"{cert.pk}; run preflight again.",
            {"certification": cert.pk},
        )
    if not result["admitted"]:
        raise NotCertified(
            f"certification {cert.pk} rejected task {task.instance_id!r}: {result['reason']}.",
            {"certification": cert.pk, "reason": result["reason"]},
        )
    if result["digest"] != task_digest:
        raise NotCertified(
            f"task {task.instance_id!r} differs from the one certification {cert.pk} admitted "
            f"(digest {result['digest'][:12]}, now {task_digest[:12]}).",
            {"certification": cert.pk},
        )
    return cert


_TASK_DIGEST_FIELDS = (
    "instance_id",
    "image",
    "base_commit",
    "patch",
    "test_patch",
    "fail_to_pass",
    "pass_to_pass",
    "suites",
    "conditions",
    "excluded_test_config",
)


def job_config(job: Any) -> dict[str, Any]:
    """The job's grading configuration (``grading.certify.job_grading_config``)."""
    return certify.job_grading_config(
        egress=job.egress,
        reuse_enabled=job.reuse_enabled,
        reuse_max_uses=job.reuse_max_uses,
        backend=settings.SANDMAN_BACKEND,
    )


def task_digest_of(task: Task) -> str:
    return certify.task_digest({name: getattr(task, name) for name in _TASK_DIGEST_FIELDS})
