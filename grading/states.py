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
