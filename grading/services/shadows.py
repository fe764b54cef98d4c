"""Writes of a shadow grading: its outcome, stored on the grading it checks.

Rule a reader must not break: a shadow never changes the grading's verdict; it only records
what a never-used sandbox answered and whether that agrees (``None`` when the shadow had no
verdict of its own: an infrastructure failure is not a disagreement).
"""

from __future__ import annotations

from typing import Any

from grading.models import Grading


def grading_shadow_recorded(*, grading: Grading, shadow: dict[str, Any]) -> None:
    """Store the shadow's outcome and the agreement of its verdict with the grading's."""
    verdict = shadow.get("verdict")
    grading.shadow = dict(shadow)
    grading.shadow_agrees = None if verdict is None else verdict == grading.verdict
    grading.save(update_fields=["shadow", "shadow_agrees"])
