"""Lifecycles of the grading app as explicit state machines: states, terminal sets, moves.

The transition maps are the only truth about which moves are legal; the transition
services in ``grading/services.py`` refuse anything not listed (``InvalidTransition``).
Colours are for the dashboards, one per state.
"""

from __future__ import annotations

from django.db import models


class TaskState(models.TextChoices):
    # A retired task stays stored (gradings and certifications point at it) but takes no
    # new gradings and leaves task-set listings for new work.
    ACTIVE = "active", "active"
    RETIRED = "retired", "retired"


TASK_TERMINAL = frozenset({TaskState.RETIRED})
TASK_TRANSITIONS: dict[str, frozenset[str]] = {
    TaskState.ACTIVE: frozenset({TaskState.RETIRED}),
    TaskState.RETIRED: frozenset(),
}
TASK_COLOURS = {TaskState.ACTIVE: "#3ebd93", TaskState.RETIRED: "#52606d"}


class GradingState(models.TextChoices):
    # queued: stored, waiting for a runner; running: a runner holds it (with a lease);
    # done: a verdict (resolved / unresolved / no_verdict) is stored.
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    DONE = "done", "done"


GRADING_TERMINAL = frozenset({GradingState.DONE})
GRADING_TRANSITIONS: dict[str, frozenset[str]] = {
    GradingState.QUEUED: frozenset({GradingState.RUNNING}),
    # running → running: a runner takes over a grading whose lease ran out (a restart).
    GradingState.RUNNING: frozenset({GradingState.RUNNING, GradingState.DONE}),
    GradingState.DONE: frozenset(),
}
GRADING_COLOURS = {
    GradingState.QUEUED: "#9aa5b1",
    GradingState.RUNNING: "#2186eb",
    GradingState.DONE: "#3ebd93",
}


class VerdictChoice(models.TextChoices):
    """The stored verdict; the values are ``grading.verdicts.Verdict``'s."""

    RESOLVED = "resolved", "resolved"
    UNRESOLVED = "unresolved", "unresolved"
    NO_VERDICT = "no_verdict", "no verdict"


class CertificationState(models.TextChoices):
    # running: preflight gradings are queued or running; done: every task of the set was
    # admitted or rejected and the chain over the admitted tasks is stored.
    RUNNING = "running", "running"
    DONE = "done", "done"


CERTIFICATION_TERMINAL = frozenset({CertificationState.DONE})
CERTIFICATION_TRANSITIONS: dict[str, frozenset[str]] = {
    CertificationState.RUNNING: frozenset({CertificationState.DONE}),
    CertificationState.DONE: frozenset(),
}
CERTIFICATION_COLOURS = {
    CertificationState.RUNNING: "#2186eb",
    CertificationState.DONE: "#3ebd93",
}


class PreflightKind(models.TextChoices):
    """Which patch a preflight grading grades: the task's reference fix, or nothing."""

    REFERENCE = "reference", "reference patch"
    EMPTY = "empty", "empty patch"
