"""REST v1 for incident records: list/create, detail/patch, accounting, export, import.

Reads need an authenticated user; writes (create, patch, import) need a staff user
(``IsStaffForWrites``), else 403. Each view validates its input with a nested
serializer, makes one service or selector call, and serializes the answer; every error
leaves as ``{"error", "detail"}`` through ``sandman_site.api_errors``. The v1 contract puts
two operations on one path (``GET``/``POST /incidents/``, ``GET``/``PATCH /incidents/{id}/``),
so those views hold one method per operation, each with its own serializers.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import SAFE_METHODS, BasePermission, IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from incidents import records, rules, selectors, services
from incidents.exports import export_document
from incidents.models import Incident
from incidents.states import EvidenceKind, GpuHourBasis, IncidentStatus, Stage
from sandman_site.errors import InvalidTransition, NotFound
from sandman_site.openapi import error_responses
from sandman_site.pagination import Page
from sandman_site.parsers import I64_MAX


class IsStaffForWrites(BasePermission):
    message = "Only staff users may record or change incidents."

    def has_permission(self, request: Request, view: Any) -> bool:
        user = request.user
        if not (user and user.is_authenticated):
            return False
        return request.method in SAFE_METHODS or bool(user.is_staff)


class IncidentCollectionApi(APIView):
    """``GET`` lists incidents (filters below); ``POST`` records one (staff)."""

    permission_classes = [IsStaffForWrites]

    class FilterSerializer(serializers.Serializer):
        status = serializers.ChoiceField(choices=IncidentStatus.choices, required=False)
        stage = serializers.ChoiceField(choices=Stage.choices, required=False)
        evidence_kind = serializers.ChoiceField(choices=EvidenceKind.choices, required=False)
        gpu_hours_basis = serializers.ChoiceField(
            choices=[c for c in GpuHourBasis.values if c], required=False
        )
        cause = serializers.ChoiceField(
            choices=[
                *rules.CLASS_ORDER,
                "has:implementation",
                "has:kubernetes_default",
                "has:cluster_service",
            ],
            required=False,
        )
        has_account = serializers.BooleanField(required=False, allow_null=True, default=None)
        job = serializers.IntegerField(min_value=1, max_value=I64_MAX, required=False)
        detector_key = serializers.CharField(max_length=64, required=False)
        q = serializers.CharField(max_length=200, required=False)

        class Meta:
            ref_name = "IncidentFilter"

    class InputSerializer(records.IncidentFieldsSerializer):
        class Meta:
            ref_name = "IncidentInput"

    @extend_schema(
        parameters=[FilterSerializer], responses=records.IncidentRecordSerializer(many=True)
    )
    def get(self, request: Request) -> Response:
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        qs = selectors.incident_list(filters=filters.validated_data)
        paginator = Page()
        page = paginator.paginate_queryset(qs, request, view=self)
        return paginator.get_paginated_response(
            records.IncidentRecordSerializer(page, many=True).data
        )

    @extend_schema(request=InputSerializer, responses={201: records.IncidentRecordSerializer})
    def post(self, request: Request) -> Response:
        body = self.InputSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        # The answer is read inside the write's transaction: a database lost after its
        # COMMIT must not answer 503 ("nothing was changed") for a stored incident.
        with transaction.atomic():
            incident = services.incident_create(
                data=body.validated_data, recorded_by=request.user, now=timezone.now()
            )
            out = records.IncidentRecordSerializer(
                selectors.incident_get(incident_id=incident.pk)
            ).data
        return Response(out, status=status.HTTP_201_CREATED)


def _get(incident_id: int) -> Incident:
    try:
        return selectors.incident_get(incident_id=incident_id)
    except Incident.DoesNotExist as exc:
        raise NotFound(f"No incident {incident_id}.") from exc


class IncidentDetailApi(APIView):
    """``GET`` one incident; ``PATCH`` changes the given fields (staff). A status change
    must be a listed move (409 ``invalid_transition`` otherwise)."""

    permission_classes = [IsStaffForWrites]

    class PatchSerializer(records.IncidentFieldsSerializer):
        class Meta:
            ref_name = "IncidentPatch"

    @extend_schema(responses=records.IncidentRecordSerializer)
    def get(self, request: Request, incident_id: int) -> Response:
        return Response(records.IncidentRecordSerializer(_get(incident_id)).data)

    @extend_schema(
        request=PatchSerializer,
        responses={200: records.IncidentRecordSerializer, **error_responses(InvalidTransition)},
    )
    def patch(self, request: Request, incident_id: int) -> Response:
        _get(incident_id)
        body = self.PatchSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        with transaction.atomic():  # the answer read before the COMMIT, as for a create
            services.incident_update(
                incident_id=incident_id, data=body.validated_data, now=timezone.now()
            )
            out = records.IncidentRecordSerializer(_get(incident_id)).data
        return Response(out)


class _GpuHoursSerializer(serializers.Serializer):
    low = serializers.DecimalField(max_digits=12, decimal_places=1, coerce_to_string=False)
    high = serializers.DecimalField(max_digits=12, decimal_places=1, coerce_to_string=False)
    cases = serializers.IntegerField()

    class Meta:
        ref_name = "IncidentGpuHours"


class _ClassRowSerializer(serializers.Serializer):
    path = serializers.CharField()
    root_cause_class = serializers.CharField(source="key")
    # "label" is a wire field name; DRF's stubs type Field.label as a string attribute.
    label = serializers.CharField()  # type: ignore[assignment]
    bounds = _GpuHoursSerializer()

    class Meta:
        ref_name = "IncidentAccountingClassRow"


class _WorkloadRowSerializer(serializers.Serializer):
    path = serializers.CharField()
    workload = serializers.CharField()
    bounds = _GpuHoursSerializer()

    class Meta:
        ref_name = "IncidentAccountingWorkloadRow"


class _TotalsSerializer(serializers.Serializer):
    sandbox = _GpuHoursSerializer()
    outside = _GpuHoursSerializer()
    all = _GpuHoursSerializer()

    class Meta:
        ref_name = "IncidentAccountingTotals"


class _CaseSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    title = serializers.CharField()
    workload = serializers.CharField()
    path = serializers.CharField()
    root_cause_class = serializers.CharField(source="cause_class_label")
    gpu_hours_basis = serializers.CharField()
    gpu_hours_low = serializers.DecimalField(
        max_digits=10, decimal_places=1, coerce_to_string=False
    )
    gpu_hours_high = serializers.DecimalField(
        max_digits=10, decimal_places=1, coerce_to_string=False
    )
    counted = serializers.SerializerMethodField()
    overlaps_with = serializers.IntegerField(allow_null=True)

    class Meta:
        ref_name = "IncidentAccountingCase"

    def get_counted(self, case: Any) -> bool:
        return case.overlaps_with is None


class AccountingApi(APIView):
    """Table A49: GPU-hour bounds by root-cause class and by workload, per path; every
    case with an account, flagged when a linked job is already counted elsewhere."""

    class OutputSerializer(serializers.Serializer):
        by_class = _ClassRowSerializer(many=True)
        by_workload = _WorkloadRowSerializer(many=True)
        totals = _TotalsSerializer()
        cases = _CaseSerializer(many=True)

        class Meta:
            ref_name = "IncidentAccounting"

    @extend_schema(responses=OutputSerializer)
    def get(self, request: Request) -> Response:
        return Response(self.OutputSerializer(selectors.accounting()).data)


class ExportApi(APIView):
    """Every incident as one JSON document that ``POST /incidents/import/`` accepts."""

    @extend_schema(responses={200: dict})
    def get(self, request: Request) -> Response:
        document = export_document(selectors.export_queryset(), now=timezone.now())
        return Response(document)


class ImportApi(APIView):
    """All-or-nothing import (staff): a bad record is a 400 naming its index, and then
    nothing is written."""

    permission_classes = [IsAdminUser]

    class OutputSerializer(serializers.Serializer):
        created = serializers.IntegerField()
        updated = serializers.IntegerField()

        class Meta:
            ref_name = "IncidentImportResult"

    @extend_schema(request=dict, responses=OutputSerializer)
    def post(self, request: Request) -> Response:
        parsed = records.parse_import(request.data)
        result = services.incidents_import(
            records=parsed, recorded_by=request.user, now=timezone.now()
        )
        return Response(self.OutputSerializer(result).data)
