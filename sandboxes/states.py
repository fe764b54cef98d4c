"""Lifecycles as explicit state machines: states, terminal sets, allowed transitions, colours.

The transition maps are the only truth about which moves are legal; the transition
services in ``sandboxes/services`` refuse anything not listed (``InvalidTransition``).
Colours are for the dashboards, one per state.
"""

from __future__ import annotations

from django.db import models


class JobState(models.TextChoices):
    ACTIVE = "active", "active"
    DRAINING = "draining", "draining"
    DRAINED = "drained", "drained"


class SandboxState(models.TextChoices):
    REQUESTED = "requested", "requested"
    CREATING = "creating", "creating"
    READY = "ready", "ready"
    IN_USE = "in_use", "in use"
    RELEASED = "released", "released"
    DELETING = "deleting", "deleting"
    DELETED = "deleted", "deleted"
    FAILED = "failed", "failed"


SANDBOX_TERMINAL = frozenset({SandboxState.DELETED})
# States in which the sandbox holds (or may hold) a backend resource.
SANDBOX_LIVE = frozenset(
    {
        SandboxState.REQUESTED,
        SandboxState.CREATING,
        SandboxState.READY,
        SandboxState.IN_USE,
        SandboxState.RELEASED,
        SandboxState.DELETING,
        SandboxState.FAILED,
    }
)
SANDBOX_TRANSITIONS: dict[str, frozenset[str]] = {
    SandboxState.REQUESTED: frozenset(
        {SandboxState.CREATING, SandboxState.FAILED, SandboxState.DELETING, SandboxState.DELETED}
    ),
    SandboxState.CREATING: frozenset(
        {SandboxState.READY, SandboxState.FAILED, SandboxState.DELETING}
    ),
    SandboxState.READY: frozenset(
        {SandboxState.IN_USE, SandboxState.DELETING, SandboxState.FAILED}
    ),
    SandboxState.IN_USE: frozenset(
        {SandboxState.RELEASED, SandboxState.DELETING, SandboxState.FAILED}
    ),
    SandboxState.RELEASED: frozenset(
        {SandboxState.READY, SandboxState.DELETING, SandboxState.FAILED}
    ),
    SandboxState.DELETING: frozenset({SandboxState.DELETED, SandboxState.FAILED}),
    SandboxState.FAILED: frozenset({SandboxState.DELETING, SandboxState.DELETED}),
    SandboxState.DELETED: frozenset(),
}
SANDBOX_COLOURS = {
    SandboxState.REQUESTED: "#9aa5b1",
    SandboxState.CREATING: "#f0b429",
    SandboxState.READY: "#3ebd93",
    SandboxState.IN_USE: "#2186eb",
    SandboxState.RELEASED: "#7b61ff",
    SandboxState.DELETING: "#f7a35c",
    SandboxState.DELETED: "#52606d",
    SandboxState.FAILED: "#e12d39",
}


class SandboxSource(models.TextChoices):
    WARM = "warm", "warm"
    REUSED = "reused", "reused"
    CREATED = "created", "created"


class Role(models.TextChoices):
    ROLLOUT = "rollout", "rollout"
    GRADING = "grading", "grading"


class Egress(models.TextChoices):
    DENY = "deny", "deny"
    ALLOW = "allow", "allow"


class AcquisitionOutcome(models.TextChoices):
    PENDING = "pending", "pending"
    OK = "ok", "ok"
    TIMEOUT = "timeout", "timeout"
    CAP = "cap", "pod cap"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    # No create: a subnet's free pod addresses are under the floor (sandboxes.addresses).
    ADDRESS_FLOOR = "address_floor", "address floor"


ACQUISITION_TERMINAL = frozenset(
    {
        AcquisitionOutcome.OK,
        AcquisitionOutcome.TIMEOUT,
        AcquisitionOutcome.CAP,
        AcquisitionOutcome.FAILED,
        AcquisitionOutcome.CANCELLED,
        AcquisitionOutcome.ADDRESS_FLOOR,
    }
)
ACQUISITION_TRANSITIONS: dict[str, frozenset[str]] = {
    AcquisitionOutcome.PENDING: ACQUISITION_TERMINAL,
    **{state: frozenset() for state in ACQUISITION_TERMINAL},
}
ACQUISITION_COLOURS = {
    AcquisitionOutcome.PENDING: "#9aa5b1",
    AcquisitionOutcome.OK: "#3ebd93",
    AcquisitionOutcome.TIMEOUT: "#f0b429",
    AcquisitionOutcome.CAP: "#f7a35c",
    AcquisitionOutcome.FAILED: "#e12d39",
    AcquisitionOutcome.CANCELLED: "#52606d",
    AcquisitionOutcome.ADDRESS_FLOOR: "#8e44ad",
}
