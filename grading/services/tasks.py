"""Writes for tasks, task sets and patch captures (``<entity>_<action>``, keyword-only).

Rules a reader must not break:
* Input reaching a service is already validated and normalised (``grading/apis.py``'s
  serializers, which ``import_tasks`` uses too); services check only what needs the
  database (uniqueness), inside the transaction that writes.
* A batch is all or nothing: ``task_import`` stores every task of a file or none.
* State changes go through ``task_transition`` only, which consults ``TASK_TRANSITIONS``,
  stamps the time and saves with ``update_fields``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Sequence
from typing import Any

from django.db import IntegrityError, transaction

from grading.errors import CaptureFailed, TaskExists
from grading.harness import InfrastructureFailure, capture_patch
from grading.models import PatchCapture, Task, TaskSet
from grading.states import TASK_TRANSITIONS, TaskState
from sandboxes.execd_client import ExecdClient
from sandboxes.models import Sandbox
from sandboxes.states import Role, SandboxState
from sandman_site.errors import InvalidTransition, NotFound

# The keys a validated task carries (the serializer's output): exactly the model's fields.
TASK_FIELDS = (
    "instance_id",
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "fail_to_pass",
    "pass_to_pass",
    "version",
    "environment_setup_commit",
    "problem_statement",
    "image",
    "suites",
    "conditions",
    "excluded_test_config",
)


def _build(fields: dict[str, Any], *, created_by: Any, now: dt.datetime) -> Task:
    unknown = sorted(set(fields) - set(TASK_FIELDS))
    if unknown:
        raise TypeError(f"unknown task fields: {unknown}")
    return Task(**fields, created_by=created_by, created_at=now, state_changed_at=now)


def task_create(*, created_by: Any, now: dt.datetime, fields: dict[str, Any]) -> Task:
    """Store one validated task; an ``instance_id`` already stored is a 409."""
    return task_import(created_by=created_by, now=now, tasks=[fields])[0]


def task_import(
    *,
    created_by: Any,
    now: dt.datetime,
    tasks: Sequence[dict[str, Any]],
    task_set: str | None = None,
) -> list[Task]:
    """Store every task (and add them to ``task_set``, created if new) or nothing at all."""
    ids = [fields["instance_id"] for fields in tasks]
    seen: set[str] = set()
    for number, instance_id in enumerate(ids, start=1):
        if instance_id in seen:
            raise TaskExists(
                f"instance_id {instance_id!r} appears twice (again at task {number}).",
                {"instance_id": instance_id, "index": number},
            )
        seen.add(instance_id)
    with transaction.atomic():
        stored = sorted(
            Task.objects.filter(instance_id__in=ids).values_list("instance_id", flat=True)
        )
        if stored:
            raise TaskExists(
                f"instance_id {stored[0]!r} is already stored; tasks never change.",
                {"instance_ids": stored[:20]},
            )
        rows = [_build(fields, created_by=created_by, now=now) for fields in tasks]
        try:
            with transaction.atomic():
                created = Task.objects.bulk_create(rows)
        except IntegrityError as exc:  # a concurrent import took an instance_id first
            raise TaskExists("an instance_id was stored concurrently; nothing imported.") from exc
        if task_set is not None:
            group, _ = TaskSet.objects.get_or_create(
                name=task_set, defaults={"created_by": created_by, "created_at": now}
            )
            group.tasks.add(*created)
    return created


def task_set_create(
    *,
    created_by: Any,
    now: dt.datetime,
    name: str,
    description: str = "",
    instance_ids: Sequence[str],
) -> TaskSet:
    """Group stored tasks under a new name; an unknown ``instance_id`` is a 404, nothing made."""
    with transaction.atomic():
        if TaskSet.objects.filter(name=name).exists():
            raise TaskExists(f"task set {name!r} already exists.", {"name": name})
        tasks = list(Task.objects.filter(instance_id__in=set(instance_ids)))
        missing = sorted(set(instance_ids) - {task.instance_id for task in tasks})
        if missing:
            raise NotFound(
                f"unknown task {missing[0]!r}; nothing created.", {"instance_ids": missing[:20]}
            )
        group = TaskSet.objects.create(
            name=name, description=description, created_by=created_by, created_at=now
        )
        group.tasks.add(*tasks)
    return group


def task_transition(*, task: Task, to: str, now: dt.datetime) -> Task:
    """Move a task to state ``to`` if the transition map allows it."""
    if to not in TASK_TRANSITIONS[task.state]:
        raise InvalidTransition(
            f"task {task.instance_id!r} cannot go from {task.state} to {to}.",
            {"from": task.state, "to": to},
        )
    task.state = to
    task.state_changed_at = now
    task.save(update_fields=["state", "state_changed_at"])
    return task


def task_retire(*, task: Task, now: dt.datetime) -> Task:
    return task_transition(task=task, to=TaskState.RETIRED, now=now)


def patch_capture_create(
    *, sandbox: Sandbox, task: Task, created_by: Any, now: dt.datetime
) -> PatchCapture:
    """Capture the agent's patch from a handed-out rollout sandbox and store it with its hash.

    The execd exchange runs OUTSIDE any transaction (it may take seconds); only the insert
    is written. A sandbox not in use, or not a rollout sandbox, is a 409.
    """
    if sandbox.state != SandboxState.IN_USE or sandbox.role != Role.ROLLOUT:
        raise InvalidTransition(
            f"sandbox {sandbox.pk} is a {sandbox.role} sandbox in state {sandbox.state}; "
            "capture needs a rollout sandbox in use.",
            {"state": sandbox.state, "role": sandbox.role},
        )

    address, token = sandbox.address, sandbox.token  # the token is deferred: read it here

    async def run() -> Any:
        async with ExecdClient(address, token) as execd:
            return await capture_patch(
                execd, base_commit=task.base_commit, excluded=task.excluded_test_config
            )

    try:
        captured = asyncio.run(run())
    except InfrastructureFailure as exc:
        raise CaptureFailed(f"could not capture sandbox {sandbox.pk}'s patch: {exc}") from exc
    return PatchCapture.objects.create(
        task=task,
        job_id=sandbox.job_id,
        sandbox_id=sandbox.pk,
        patch=captured.text,
        sha256=captured.sha256,
        created_by=created_by,
        created_at=now,
    )
