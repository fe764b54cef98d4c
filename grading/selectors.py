"""Reads of the grading app for the REST API and the admin: tasks and task sets.

Rules a reader must not break: no side effects; tasks are a catalogue every authenticated
trainer may read (they hold no secrets), so there is no ownership filter on them. Gradings
belong to jobs and are seen only by the job's owner (staff see all); anything else is a 404.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from grading.models import Grading, PatchCapture, Task, TaskSet
from sandman_site.errors import NotFound


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
