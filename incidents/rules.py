"""Validation rules and root-cause naming of an incident record, free of Django.

``Incident.clean()`` (admin forms) and ``incidents.services`` (API, import, detectors)
both call these, so the admin and the API can never disagree about what a valid record
is. Each function returns ``{field: message}``; empty means valid. The database backs the
same rules with check constraints (``incidents/models.py``).

A root-cause class is the set of flags (implementation, Kubernetes default, cluster or
shared service); the empty set is "not established". ``cause_class_key`` and
``cause_class_label`` are the one mapping from flags to the names the accounting page
and the exports show.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

ACCOUNT_BASES = ("lifetime", "allocated", "stall")

_PART_KEYS = ("implementation", "kubernetes_default", "cluster_service")
_LABELS = {
    (): "not established",
    ("implementation",): "sandbox implementation",
    ("kubernetes_default",): "Kubernetes default",
    ("cluster_service",): "cluster or shared service",
    ("implementation", "kubernetes_default"): "implementation and Kubernetes default",
    ("implementation", "cluster_service"): "implementation and cluster or shared service",
    ("kubernetes_default", "cluster_service"): "Kubernetes default and cluster or shared service",
    ("implementation", "kubernetes_default", "cluster_service"): (
        "implementation, Kubernetes default and cluster or shared service"
    ),
}
# Display order on the accounting page: implementation first, "not established" last.
CLASS_ORDER = (
    "implementation",
    "implementation+kubernetes_default",
    "implementation+cluster_service",
    "implementation+kubernetes_default+cluster_service",
    "kubernetes_default",
    "kubernetes_default+cluster_service",
    "cluster_service",
    "not_established",
)


def _parts(implementation: bool, kubernetes_default: bool, cluster_service: bool) -> tuple:
    flags = (implementation, kubernetes_default, cluster_service)
    return tuple(key for key, on in zip(_PART_KEYS, flags, strict=True) if on)


def cause_class_key(
    *, implementation: bool, kubernetes_default: bool, cluster_service: bool
) -> str:
    """A stable key for the class, e.g. ``implementation+kubernetes_default``."""
    parts = _parts(implementation, kubernetes_default, cluster_service)
    return "+".join(parts) if parts else "not_established"


def cause_class_label(
    *, implementation: bool, kubernetes_default: bool, cluster_service: bool
) -> str:
    """The class as the paper names it, e.g. ``implementation and Kubernetes default``."""
    return _LABELS[_parts(implementation, kubernetes_default, cluster_service)]


def class_sort_index(key: str) -> int:
    return CLASS_ORDER.index(key) if key in CLASS_ORDER else len(CLASS_ORDER)


def account_errors(*, low: Decimal | None, high: Decimal | None, basis: str) -> dict[str, str]:
    """GPU-hour account: both bounds and a basis, or none of the three; 0 <= low <= high."""
    errors: dict[str, str] = {}
    if basis and basis not in ACCOUNT_BASES:
        errors["gpu_hours_basis"] = f"Unknown GPU-hour basis {basis!r}."
        return errors
    has_bounds = low is not None or high is not None
    if has_bounds and not basis:
        errors["gpu_hours_basis"] = (
            "A GPU-hour account needs a basis (lifetime, allocated or stall)."
        )
    if basis and (low is None or high is None):
        missing = "gpu_hours_low" if low is None else "gpu_hours_high"
        errors[missing] = (
            f"A {basis} basis needs both GPU-hour bounds (use the same number twice "
            "for a single value)."
        )
    if low is not None and low < 0:
        errors["gpu_hours_low"] = "GPU-hour bounds cannot be negative."
    if high is not None and high < 0:
        errors["gpu_hours_high"] = "GPU-hour bounds cannot be negative."
    if low is not None and high is not None and low > high and "gpu_hours_low" not in errors:
        errors["gpu_hours_low"] = (
            f"The lower GPU-hour bound ({low}) is above the upper bound ({high})."
        )
    return errors


def window_errors(*, started_at: datetime | None, ended_at: datetime | None) -> dict[str, str]:
    """The case's end, when known, is not before its start."""
    if started_at is not None and ended_at is not None and ended_at < started_at:
        return {
            "ended_at": f"The end ({ended_at:%Y-%m-%d %H:%M}) is before the start "
            f"({started_at:%Y-%m-%d %H:%M})."
        }
    return {}
