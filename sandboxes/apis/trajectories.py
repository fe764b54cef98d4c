"""REST views for the trainer's training records and their critical path (Appendix J).

``POST /api/v1/jobs/{id}/trajectories/`` and ``/learner-steps/`` take up to 10,000 records a
call; ``GET /api/v1/jobs/{id}/critical-path/`` answers the attribution. Ownership is checked
FIRST (404 for another owner's job, whatever the body). Every field has a bound so that no
body reaches the database as something it refuses: a bad record is a 400 naming its index,
never a 5xx.
"""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from sandboxes import selectors
from sandboxes.apis.common import JsonApiView, StrictCharField, StrictSerializer
from sandboxes.critical_path import PHASE_KINDS
from sandboxes.services.trajectories import (
    ReportCounts,
    learner_steps_report,
    trajectories_report,
)
from sandboxes.training_selectors import critical_path
from sandman_site.errors import InvalidInput

MAX_RECORDS = 10_000
# Epoch seconds: 0 to the year 5138; bounded so the stored double stays a plain time.
_MAX_EPOCH_S = 1e11
_MAX_ID = 200


def _epoch(**kwargs: Any) -> serializers.FloatField:
    return serializers.FloatField(min_value=0, max_value=_MAX_EPOCH_S, **kwargs)


class PhaseSerializer(StrictSerializer):
    kind = serializers.ChoiceField(choices=PHASE_KINDS)
    start = _epoch()
    end = _epoch()


class TrajectoryRecordSerializer(StrictSerializer):
    id = StrictCharField(max_length=_MAX_ID)
    slot = serializers.IntegerField(min_value=0, max_value=1_000_000)
    group = StrictCharField(max_length=_MAX_ID)
    start = _epoch()
    end = _epoch()
    failed = serializers.BooleanField()
    predecessor = StrictCharField(max_length=_MAX_ID, required=False, allow_null=True)
    sandbox_ids = serializers.ListField(
        child=serializers.IntegerField(min_value=1, max_value=2**62),
        max_length=64,
        required=False,
        default=list,
    )
    phases = serializers.ListField(child=PhaseSerializer(), max_length=256)


class LearnerStepRecordSerializer(StrictSerializer):
    step = serializers.IntegerField(min_value=0, max_value=2_000_000_000)
    wait_start = _epoch()
    wait_end = _epoch()
    handover_end = _epoch(required=False, allow_null=True)
    train_end = _epoch()
    groups = serializers.ListField(
        child=StrictCharField(max_length=_MAX_ID), allow_empty=False, max_length=4096
    )
    dropped_groups = serializers.ListField(
        child=StrictCharField(max_length=_MAX_ID), max_length=4096, required=False, default=list
    )


class ReportOutputSerializer(serializers.Serializer):
    received = serializers.IntegerField()
    stored = serializers.IntegerField()
    duplicates = serializers.IntegerField(help_text="records whose id was already stored")


def _first_message(errors: Any, path: str = "") -> str:
    """``field.sub: message`` of the first error in a nested DRF error structure."""
    if isinstance(errors, dict):
        for field, value in errors.items():
            if value:
                return _first_message(value, f"{path}.{field}" if path else str(field))
    if isinstance(errors, list):
        for i, value in enumerate(errors):
            if value:
                nested = isinstance(value, (dict, list))
                return _first_message(value, f"{path}[{i}]" if nested else path)
    return f"{path}: {errors}" if path else str(errors)


def _validated_records(serializer: serializers.Serializer, key: str) -> list[dict[str, Any]]:
    """The batch, or ``InvalidInput`` naming the first bad record's index."""
    if serializer.is_valid():
        return serializer.validated_data[key]
    errors = serializer.errors.get(key)
    # A ListField reports its children's errors as {index: errors}.
    if isinstance(errors, dict) and errors and all(isinstance(i, int) for i in errors):
        index = min(errors)
        detail = _first_message(errors[index])
        raise InvalidInput(f"record {index}: {detail}", {"index": index, "fields": errors[index]})
    raise serializers.ValidationError(serializer.errors)


def _counts(counts: ReportCounts) -> Response:
    return Response(ReportOutputSerializer(counts).data)


class JobTrajectoriesApi(JsonApiView):
    """POST /api/v1/jobs/{id}/trajectories/ — a batch of trajectories, idempotent by id."""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "TrajectoriesInput"

        trajectories = serializers.ListField(
            child=TrajectoryRecordSerializer(), allow_empty=False, max_length=MAX_RECORDS
        )

    @extend_schema(
        operation_id="job_trajectories_report",
        request=InputSerializer,
        responses={200: ReportOutputSerializer},
    )
    def post(self, request: Request, job_id: int) -> Response:
        job = selectors.job_get_for_user(user=request.user, job_id=job_id)
        data = JobTrajectoriesApi.InputSerializer(data=request.data)
        records = _validated_records(data, "trajectories")
        return _counts(trajectories_report(job_id=job.pk, records=records, now=timezone.now()))


class JobLearnerStepsApi(JsonApiView):
    """POST /api/v1/jobs/{id}/learner-steps/ — a batch of learner steps, idempotent by step."""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "LearnerStepsInput"

        steps = serializers.ListField(
            child=LearnerStepRecordSerializer(), allow_empty=False, max_length=MAX_RECORDS
        )

    @extend_schema(
        operation_id="job_learner_steps_report",
        request=InputSerializer,
        responses={200: ReportOutputSerializer},
    )
    def post(self, request: Request, job_id: int) -> Response:
        job = selectors.job_get_for_user(user=request.user, job_id=job_id)
        data = JobLearnerStepsApi.InputSerializer(data=request.data)
        records = _validated_records(data, "steps")
        return _counts(learner_steps_report(job_id=job.pk, records=records, now=timezone.now()))


class EstimateOutputSerializer(serializers.Serializer):
    trajectories_per_step = serializers.FloatField()
    mean_trajectory_s = serializers.FloatField()
    mean_in_flight = serializers.FloatField()
    estimated_interval_s = serializers.FloatField(help_text="Little's law (an estimate)")
    measured_interval_s = serializers.FloatField()
    f = serializers.FloatField(help_text="share of trajectory time in acquisition and failures")
    estimated_reduction = serializers.FloatField(help_text="about f; a model output")
    caveat = serializers.CharField()


class StepOutputSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    start = serializers.FloatField()
    end = serializers.FloatField()
    interval_s = serializers.FloatField(source="interval")
    ended_by = serializers.CharField(allow_null=True)
    seconds = serializers.DictField(child=serializers.FloatField())
    shares = serializers.SerializerMethodField()

    def get_shares(self, obj: Any) -> dict[str, float]:
        return obj.shares()


class JobCriticalPathApi(JsonApiView):
    """GET /api/v1/jobs/{id}/critical-path/?from=&to= — Appendix J for the job's steps."""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "CriticalPathQuery"

        # "from" is a keyword: declared below through fields["from"].
        to = _epoch(required=False)

        def get_fields(self) -> dict[str, serializers.Field]:
            fields = super().get_fields()
            fields["from"] = _epoch(required=False)
            return fields

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            lo, hi = attrs.get("from"), attrs.get("to")
            if lo is not None and hi is not None and hi < lo:
                raise serializers.ValidationError({"to": "must not be before from"})
            return {"lo": lo, "hi": hi}

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "CriticalPathOutput"

        steps = serializers.IntegerField()
        shares = serializers.DictField(child=serializers.FloatField())
        unresolved_share = serializers.FloatField()
        waiting_share = serializers.FloatField(allow_null=True)
        estimate = EstimateOutputSerializer(allow_null=True)
        per_step = StepOutputSerializer(many=True)

    @extend_schema(
        operation_id="job_critical_path",
        parameters=[
            OpenApiParameter("from", float, description="epoch seconds: steps starting after"),
            OpenApiParameter("to", float, description="epoch seconds: steps ending before"),
        ],
        responses={200: OutputSerializer},
    )
    def get(self, request: Request, job_id: int) -> Response:
        job = selectors.job_get_for_user(user=request.user, job_id=job_id)
        query = JobCriticalPathApi.InputSerializer(data=request.query_params.dict())
        query.is_valid(raise_exception=True)
        found = critical_path(job.pk, **query.validated_data)
        result = found.attribution
        body = {
            "steps": len(result.per_step),
            "shares": result.shares,
            "unresolved_share": result.unresolved_share,
            "waiting_share": found.waiting_share,
            "estimate": found.estimate,
            "per_step": result.per_step,
        }
        return Response(JobCriticalPathApi.OutputSerializer(body).data)
