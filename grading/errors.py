"""Errors of the grading app, members of the one Sandman error family (``sandman_site.errors``).

Each names its wire ``code`` and HTTP ``status``; the one DRF handler translates them.
"""

from __future__ import annotations

from sandman_site.errors import SandmanError


class TaskExists(SandmanError):
    """An ``instance_id`` (or a task-set name) is already stored: tasks never change."""

    code = "task_exists"
    status = 409


class ImportRejected(SandmanError):
    """A task file has a bad line; ``extra`` names the line. Nothing of the file is stored."""

    code = "import_rejected"
    status = 400


class CaptureFailed(SandmanError):
    """The rollout sandbox's execd could not produce the patch (unreachable, erroring)."""

    code = "capture_failed"
    status = 502


class NotCertified(SandmanError):
    """A grading names a task set without a certification matching the job's configuration
    (or one that did not admit the task); the detail says what differs."""

    code = "not_certified"
    status = 409
