"""Incident records (paper Appendix M) and the pods the ownership sweep reported.

An ``Incident`` keeps where the symptom appeared (``stage``), its cause and its effect
apart, as the paper's tables do. Invariants, enforced by ``clean()`` (admin forms), by
``incidents.services`` (API, import, detectors) through ``incidents.rules`` and, as a
last line, by check constraints in the database:

* a GPU-hour account is all three of lower bound, upper bound and basis, or none of
  them, and ``0 <= gpu_hours_low <= gpu_hours_high``;
* ``ended_at``, when known, is not before ``started_at``;
* a detector opens a given ``(detector_key, detector_window)`` at most once.

Writes go through ``incidents.services``; status moves through ``incident_set_status``.
``uid`` is the identity across databases (exports, imports, fixtures via natural key).
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q

from incidents import rules
from incidents.states import EvidenceKind, GpuHourBasis, IncidentStatus, Stage

# The free-text fields of an Incident: what the admin's search and ``text_search_q``
# (incidents.selectors) look in.
TEXT_FIELDS = (
    "title",
    "what_happened",
    "how_found",
    "cause",
    "trigger",
    "fix",
    "how_verified",
    "effect",
    "workload",
)


class IncidentManager(models.Manager["Incident"]):
    def get_by_natural_key(self, uid: str) -> Incident:
        return self.get(uid=uid)


class Incident(models.Model):
    """One recorded operations case."""

    uid = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    title = models.CharField(max_length=200)
    started_at = models.DateTimeField("start")
    ended_at = models.DateTimeField("end", null=True, blank=True)
    stage = models.CharField("lifecycle stage", max_length=32, choices=Stage.choices)
    what_happened = models.TextField()
    how_found = models.TextField(blank=True, default="")
    cause = models.TextField(blank=True, default="")
    # The root-cause class is the set of these flags; none set means "not established".
    cause_in_implementation = models.BooleanField("sandbox implementation", default=False)
    cause_in_kubernetes_default = models.BooleanField("Kubernetes default", default=False)
    cause_in_cluster_service = models.BooleanField("cluster or shared service", default=False)
    trigger = models.TextField(blank=True, default="", help_text="Where it differs from the cause.")
    fix = models.TextField(blank=True, default="")
    how_verified = models.TextField(blank=True, default="")
    evidence_kind = models.CharField(max_length=16, choices=EvidenceKind.choices)
    effect = models.TextField(blank=True, default="", help_text="State the unit of each count.")
    gpu_hours_low = models.DecimalField(
        "GPU-hours (lower)", max_digits=10, decimal_places=1, null=True, blank=True
    )
    gpu_hours_high = models.DecimalField(
        "GPU-hours (upper)", max_digits=10, decimal_places=1, null=True, blank=True
    )
    gpu_hours_basis = models.CharField(
        "GPU-hour basis", max_length=16, choices=GpuHourBasis.choices, blank=True, default=""
    )
    workload = models.CharField(max_length=200, blank=True, default="")
    status = models.CharField(
        max_length=16, choices=IncidentStatus.choices, default=IncidentStatus.OPEN
    )
    status_changed_at = models.DateTimeField(null=True, blank=True)
    jobs = models.ManyToManyField("sandboxes.Job", blank=True, related_name="incidents")
    sandboxes = models.ManyToManyField("sandboxes.Sandbox", blank=True, related_name="incidents")
    # Set by detectors only: which detector opened the draft and for which window.
    detector_key = models.CharField(max_length=64, blank=True, default="")
    detector_window = models.CharField(max_length=64, blank=True, default="")
    detector_detail = models.JSONField(default=dict, blank=True)
    recorded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="recorded_incidents",
    )
    recorded_at = models.DateTimeField()
    updated_at = models.DateTimeField(auto_now=True)

    objects = IncidentManager()

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [
            models.Index(fields=["stage", "status"]),
            models.Index(fields=["recorded_at", "id"]),
            models.Index(fields=["detector_key", "started_at"]),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["detector_key", "detector_window"],
                condition=~Q(detector_key=""),
                name="incident_detector_window_once",
                violation_error_message="This detector already opened an incident for this window.",
            ),
            models.CheckConstraint(
                condition=Q(gpu_hours_low__isnull=True)
                | Q(gpu_hours_high__isnull=True)
                | Q(gpu_hours_low__lte=F("gpu_hours_high")),
                name="incident_gpu_low_le_high",
                violation_error_message="The lower GPU-hour bound is above the upper bound.",
            ),
            models.CheckConstraint(
                condition=Q(
                    gpu_hours_basis="", gpu_hours_low__isnull=True, gpu_hours_high__isnull=True
                )
                | (
                    ~Q(gpu_hours_basis="")
                    & Q(gpu_hours_low__isnull=False, gpu_hours_high__isnull=False)
                ),
                name="incident_gpu_account_complete",
                violation_error_message="A GPU-hour account needs both bounds and a basis.",
            ),
            models.CheckConstraint(
                condition=Q(gpu_hours_low__isnull=True) | Q(gpu_hours_low__gte=0),
                name="incident_gpu_low_not_negative",
                violation_error_message="GPU-hour bounds cannot be negative.",
            ),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True) | Q(ended_at__gte=F("started_at")),
                name="incident_end_not_before_start",
                violation_error_message="The end is before the start.",
            ),
        ]

    def __str__(self) -> str:
        return self.title

    def natural_key(self) -> tuple[str]:
        return (str(self.uid),)

    def clean(self) -> None:
        errors = {
            **rules.window_errors(started_at=self.started_at, ended_at=self.ended_at),
            **rules.account_errors(
                low=self.gpu_hours_low, high=self.gpu_hours_high, basis=self.gpu_hours_basis
            ),
        }
        if errors:
            raise ValidationError(errors)

    @property
    def has_account(self) -> bool:
        return bool(self.gpu_hours_basis)

    @property
    def cause_class_key(self) -> str:
        return rules.cause_class_key(
            implementation=self.cause_in_implementation,
            kubernetes_default=self.cause_in_kubernetes_default,
            cluster_service=self.cause_in_cluster_service,
        )

    @property
    def cause_class_label(self) -> str:
        return rules.cause_class_label(
            implementation=self.cause_in_implementation,
            kubernetes_default=self.cause_in_kubernetes_default,
            cluster_service=self.cause_in_cluster_service,
        )

    @property
    def outside_sandbox_path(self) -> bool:
        return self.stage == Stage.OUTSIDE


class OwnerlessPod(models.Model):
    """A labelled pod the sweep found with no live owner, and the incident that reported it.

    The name is unique, so a pod that several sweeps see is reported once.
    """

    name = models.CharField(max_length=253, unique=True)
    incident = models.ForeignKey(Incident, on_delete=models.CASCADE, related_name="ownerless_pods")
    first_seen_at = models.DateTimeField()

    def __str__(self) -> str:
        return self.name
