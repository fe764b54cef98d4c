"""Every write of the grading app (``<entity>_<action>``, keyword-only typed arguments).

``tasks``: tasks, task sets, patch captures. ``gradings``: a grading's life from queued to
its verdict. Callers import from here.
"""

from __future__ import annotations

from grading.services.certifications import (
    certification_advance,
    certification_advance_running,
    certification_start,
)
from grading.services.gradings import (
    grading_attempt_failed,
    grading_attempt_probed,
    grading_attempt_start,
    grading_claim,
    grading_create,
    grading_decided,
)
from grading.services.shadows import grading_shadow_recorded
from grading.services.tasks import (
    TASK_FIELDS,
    patch_capture_create,
    task_create,
    task_import,
    task_retire,
    task_set_create,
    task_transition,
)

__all__ = [
    "certification_advance",
    "certification_advance_running",
    "certification_start",
    "TASK_FIELDS",
    "grading_attempt_failed",
    "grading_attempt_probed",
    "grading_attempt_start",
    "grading_claim",
    "grading_create",
    "grading_decided",
    "grading_shadow_recorded",
    "patch_capture_create",
    "task_create",
    "task_import",
    "task_retire",
    "task_set_create",
    "task_transition",
]
