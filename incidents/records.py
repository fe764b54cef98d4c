"""The wire shape of one incident record: API bodies, JSON export and import.

One shape for all three, so an export can always be imported again. The root-cause
class travels as ``root_cause``: a list of ``CausePart`` values (empty: not
established). A GPU-hour account is ``gpu_hours_low``, ``gpu_hours_high`` and
``gpu_hours_basis`` (null: no account). Links are lists of job and sandbox ids.

These serializers check types and vocabularies only; the record rules (bounds, basis,
window) live in ``incidents.rules`` and are applied by ``incidents.services``, so every
path into the database applies them the same way. ``parse_import`` validates a whole
import file up front and names the first bad record by its index.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from incidents.models import Incident
from incidents.states import CausePart, EvidenceKind, GpuHourBasis, IncidentStatus, Stage
from sandman_site.errors import InvalidInput

EXPORT_FORMAT = "sandman-incidents"
EXPORT_VERSION = 1

_FLAG_FOR_PART = {
    CausePart.IMPLEMENTATION: "cause_in_implementation",
    CausePart.KUBERNETES_DEFAULT: "cause_in_kubernetes_default",
    CausePart.CLUSTER_SERVICE: "cause_in_cluster_service",
}


def _gpu_hours() -> serializers.DecimalField:
    return serializers.DecimalField(
        max_digits=10,
        decimal_places=1,
        min_value=0,
        allow_null=True,
        required=False,
        coerce_to_string=False,
    )


# Free text of a record: the paper's longest case is a few hundred characters.
MAX_TEXT_CHARS = 20_000


class IncidentFieldsSerializer(serializers.Serializer):
    """The fields an operator writes (create, patch, import)."""

    title = serializers.CharField(max_length=200)
    started_at = serializers.DateTimeField()
    ended_at = serializers.DateTimeField(allow_null=True, required=False)
    stage = serializers.ChoiceField(choices=Stage.choices)
    what_happened = serializers.CharField(max_length=MAX_TEXT_CHARS)
    how_found = serializers.CharField(max_length=MAX_TEXT_CHARS, allow_blank=True, required=False)
    cause = serializers.CharField(max_length=MAX_TEXT_CHARS, allow_blank=True, required=False)
    root_cause = serializers.ListField(
        child=serializers.ChoiceField(choices=CausePart.choices), required=False, max_length=3
    )
    trigger = serializers.CharField(max_length=MAX_TEXT_CHARS, allow_blank=True, required=False)
    fix = serializers.CharField(max_length=MAX_TEXT_CHARS, allow_blank=True, required=False)
    how_verified = serializers.CharField(
        max_length=MAX_TEXT_CHARS, allow_blank=True, required=False
    )
    evidence_kind = serializers.ChoiceField(choices=EvidenceKind.choices)
    effect = serializers.CharField(max_length=MAX_TEXT_CHARS, allow_blank=True, required=False)
    gpu_hours_low = _gpu_hours()
    gpu_hours_high = _gpu_hours()
    gpu_hours_basis = serializers.ChoiceField(
        choices=[c for c in GpuHourBasis.values if c],
        allow_null=True,
        allow_blank=True,
        required=False,
    )
    workload = serializers.CharField(max_length=200, allow_blank=True, required=False)
    status = serializers.ChoiceField(choices=IncidentStatus.choices, required=False)
    jobs = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False)
    sandboxes = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False)


class IncidentImportSerializer(IncidentFieldsSerializer):
    """An exported record: the operator's fields plus identity, audit and detector fields."""

    uid = serializers.UUIDField(required=False)
    recorded_at = serializers.DateTimeField(required=False)
    recorded_by = serializers.CharField(allow_null=True, allow_blank=True, required=False)
    status_changed_at = serializers.DateTimeField(allow_null=True, required=False)
    detector_key = serializers.CharField(max_length=64, allow_blank=True, required=False)
    detector_window = serializers.CharField(max_length=64, allow_blank=True, required=False)
    detector_detail = serializers.JSONField(required=False)


class IncidentRecordSerializer(serializers.ModelSerializer):
    """The full record as the API and the export show it (read only)."""

    root_cause = serializers.SerializerMethodField()
    root_cause_class = serializers.CharField(source="cause_class_label", read_only=True)
    outside_sandbox_path = serializers.BooleanField(read_only=True)
    # null until the case is accounted (both bounds and their basis, or none of them)
    gpu_hours_low = serializers.DecimalField(
        max_digits=10, decimal_places=1, coerce_to_string=False, read_only=True, allow_null=True
    )
    gpu_hours_high = serializers.DecimalField(
        max_digits=10, decimal_places=1, coerce_to_string=False, read_only=True, allow_null=True
    )
    gpu_hours_basis = serializers.SerializerMethodField()
    jobs = serializers.SerializerMethodField()
    sandboxes = serializers.SerializerMethodField()
    recorded_by = serializers.SerializerMethodField()

    class Meta:
        model = Incident
        fields = [
            "id",
            "uid",
            "title",
            "started_at",
            "ended_at",
            "stage",
            "what_happened",
            "how_found",
            "cause",
            "root_cause",
            "root_cause_class",
            "trigger",
            "fix",
            "how_verified",
            "evidence_kind",
            "effect",
            "gpu_hours_low",
            "gpu_hours_high",
            "gpu_hours_basis",
            "workload",
            "outside_sandbox_path",
            "status",
            "status_changed_at",
            "jobs",
            "sandboxes",
            "detector_key",
            "detector_window",
            "detector_detail",
            "recorded_by",
            "recorded_at",
        ]
        read_only_fields = fields
        ref_name = "Incident"

    def get_root_cause(self, obj: Incident) -> list[str]:
        return [part for part, flag in _FLAG_FOR_PART.items() if getattr(obj, flag)]

    def get_gpu_hours_basis(self, obj: Incident) -> str | None:
        return obj.gpu_hours_basis or None

    def get_jobs(self, obj: Incident) -> list[int]:
        return sorted(job.pk for job in obj.jobs.all())

    def get_sandboxes(self, obj: Incident) -> list[int]:
        return sorted(sandbox.pk for sandbox in obj.sandboxes.all())

    def get_recorded_by(self, obj: Incident) -> str | None:
        return obj.recorded_by.get_username() if obj.recorded_by else None


def to_model_fields(data: dict[str, Any]) -> dict[str, Any]:
    """Validated wire data -> model field values (only the keys present in ``data``).

    ``jobs``, ``sandboxes`` and ``recorded_by`` are left for the service to resolve.
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key == "root_cause":
            parts = set(value)
            for part, flag in _FLAG_FOR_PART.items():
                out[flag] = part in parts
        elif key == "gpu_hours_basis":
            out[key] = value or ""
        elif key == "detector_detail":
            out[key] = value if value is not None else {}
        elif key in {"jobs", "sandboxes", "recorded_by"}:
            continue
        else:
            out[key] = value
    return out


def parse_import(payload: Any) -> list[dict[str, Any]]:
    """Check an import document; return validated records or raise naming the bad one.

    Accepts an export document (``{"format": ..., "incidents": [...]}``) or a bare list.
    """
    if isinstance(payload, dict):
        if payload.get("format", EXPORT_FORMAT) != EXPORT_FORMAT:
            raise InvalidInput(f"Not an incident export (format {payload.get('format')!r}).")
        records = payload.get("incidents")
    else:
        records = payload
    if not isinstance(records, list):
        raise InvalidInput("An import is a list of incident records (or an export document).")
    validated: list[dict[str, Any]] = []
    seen_uids: dict[str, int] = {}
    for index, record in enumerate(records):
        serializer = IncidentImportSerializer(data=record)
        if not isinstance(record, dict) or not serializer.is_valid():
            errors = serializer.errors if isinstance(record, dict) else "not an object"
            raise InvalidInput(f"Record {index}: {_sentence(errors)}", extra={"index": index})
        data = dict(serializer.validated_data)
        uid = data.get("uid")
        if uid is not None:
            if str(uid) in seen_uids:
                raise InvalidInput(
                    f"Record {index}: uid {uid} repeats record {seen_uids[str(uid)]}.",
                    extra={"index": index},
                )
            seen_uids[str(uid)] = index
        validated.append(data)
    return validated


def _sentence(errors: Any) -> str:
    if isinstance(errors, dict):
        return "; ".join(f"{field}: {_sentence(value)}" for field, value in errors.items())
    if isinstance(errors, list):
        return " ".join(_sentence(e) for e in errors)
    return str(errors)
