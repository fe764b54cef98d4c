"""Incident lifecycle and the fixed vocabularies of an incident record (paper Appendix M).

``IncidentStatus`` is the only lifecycle: its transition map is the single truth about
legal moves, and ``incidents.services.incident_set_status`` refuses anything else
(``InvalidTransition``). ``fixed`` and ``won't fix`` are closed: the only way out of them
is reopening. The other enums are vocabularies, not lifecycles; their values are stored
in the database and written to exports, so add values, never rename them.
"""

from __future__ import annotations

from django.db import models


class IncidentStatus(models.TextChoices):
    OPEN = "open", "open"
    MITIGATED = "mitigated", "mitigated"
    FIXED = "fixed", "fixed"
    WONT_FIX = "wont_fix", "won't fix"


# Closed states: nothing more is expected; only reopening leaves them.
INCIDENT_CLOSED = frozenset({IncidentStatus.FIXED, IncidentStatus.WONT_FIX})
INCIDENT_TRANSITIONS: dict[str, frozenset[str]] = {
    IncidentStatus.OPEN: frozenset(
        {IncidentStatus.MITIGATED, IncidentStatus.FIXED, IncidentStatus.WONT_FIX}
    ),
    IncidentStatus.MITIGATED: frozenset(
        {IncidentStatus.OPEN, IncidentStatus.FIXED, IncidentStatus.WONT_FIX}
    ),
    IncidentStatus.FIXED: frozenset({IncidentStatus.OPEN}),
    IncidentStatus.WONT_FIX: frozenset({IncidentStatus.OPEN}),
}
INCIDENT_COLOURS = {
    IncidentStatus.OPEN: "#e12d39",
    IncidentStatus.MITIGATED: "#f0b429",
    IncidentStatus.FIXED: "#3ebd93",
    IncidentStatus.WONT_FIX: "#52606d",
}


def transition_allowed(current: str, target: str) -> bool:
    """True when ``current -> target`` is a listed move (staying put is not a move)."""
    return target in INCIDENT_TRANSITIONS.get(current, frozenset())


class Stage(models.TextChoices):
    """Lifecycle stage where the symptom appeared (the grouping of Tables A41–A48)."""

    SERVICE_ADMISSION = (
        "service_admission",
        "managed service, admission, scheduling and pod addresses",
    )
    CREATION = "creation", "creation and images"
    EXECUTION = "execution", "execution"
    GRADING = "grading", "grading"
    WARM_REUSE = "warm_reuse", "warm and reused sandboxes"
    CLEANUP = "cleanup", "cleanup and ownership"
    OUTSIDE = "outside", "cluster events outside the sandbox path"


class EvidenceKind(models.TextChoices):
    PRODUCTION = "production", "production"
    CONTROLLED = "controlled", "controlled"
    REPLAY = "replay", "replay"
    REPRODUCTION = "reproduction", "reproduction"


class GpuHourBasis(models.TextChoices):
    """How a GPU-hour upper bound was counted; blank means the case has no account."""

    NONE = "", "no account"
    LIFETIME = "lifetime", "lifetime"
    ALLOCATED = "allocated", "allocated"
    STALL = "stall", "stall"


class CausePart(models.TextChoices):
    """One part of a root-cause class; a case's class is a set of these (empty: not
    established). Wire names used by the API and the export format."""

    IMPLEMENTATION = "sandbox_implementation", "sandbox implementation"
    KUBERNETES_DEFAULT = "kubernetes_default", "Kubernetes default"
    CLUSTER_SERVICE = "cluster_service", "cluster or shared service"
