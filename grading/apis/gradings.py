"""REST views for patch capture on a rollout sandbox and for gradings (create → 202, get).

Each APIView is one operation: validate → one service or selector call → serialize.
Rules a reader must not break: ownership is checked before anything else (someone else's
sandbox, job or capture is a 404); creating a grading only stores it — the grading runner
does the work, woken after the commit.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import (
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from grading import selectors, services
from grading.apis.fields import PatchField
from grading.models import (
    PatchCapture,
)
from grading.runner import get_runner
from grading.states import GradingState
from sandboxes import selectors as sandbox_selectors
from sandboxes.apis.common import JsonApiView, StrictCharField, StrictSerializer
from sandman_site.openapi import error_responses


class CaptureOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    task = serializers.CharField(source="task.instance_id")
    job = serializers.IntegerField(source="job_id")
    sandbox = serializers.IntegerField(source="sandbox_id")
    patch = serializers.CharField(allow_blank=True)
    sha256 = serializers.CharField()
    size = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    def get_size(self, capture: PatchCapture) -> int:
        return len(capture.patch.encode("utf-8"))


class SandboxCaptureApi(JsonApiView):
    """POST /api/v1/sandboxes/{id}/capture/ — the agent's patch from the caller's rollout
    sandbox: its change against the task's base commit, test-configuration files left out."""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "SandboxCaptureInput"

        task = StrictCharField(max_length=200, help_text="the task's instance_id")

    OutputSerializer = CaptureOutputSerializer

    @extend_schema(
        operation_id="sandbox_capture",
        request=InputSerializer,
        responses={201: CaptureOutputSerializer, **error_responses(409, 502)},
    )
    def post(self, request: Request, sandbox_id: int) -> Response:
        # Ownership first: someone else's sandbox is a 404 whatever the body says.
        sandbox = sandbox_selectors.sandbox_get_for_user(user=request.user, sandbox_id=sandbox_id)
        data = SandboxCaptureApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        task = selectors.task_get(instance_id=data.validated_data["task"])
        capture = services.patch_capture_create(
            sandbox=sandbox, task=task, created_by=request.user, now=timezone.now()
        )
        out = SandboxCaptureApi.OutputSerializer(capture).data
        return Response(out, status=status.HTTP_201_CREATED)


class GradingCreateApi(JsonApiView):
    """POST /api/v1/gradings/ — queue a grading of a patch (or a capture) on a task → 202."""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "GradingCreateInput"

        job = serializers.IntegerField(min_value=1)
        task = StrictCharField(max_length=200, help_text="the task's instance_id")
        patch = PatchField(required=False, allow_blank=True)
        capture_id = serializers.IntegerField(min_value=1, required=False)
        suites = serializers.ListField(
            child=StrictCharField(max_length=64), required=False, min_length=1, max_length=20
        )
        task_set = serializers.IntegerField(
            min_value=1,
            required=False,
            help_text="grade for this task set: it must be certified for the job (else 409)",
        )
        shadow = serializers.BooleanField(
            required=False,
            default=False,
            help_text="also grade it on a never-used sandbox and record the agreement",
        )

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            if ("patch" in attrs) == ("capture_id" in attrs):
                raise serializers.ValidationError("give exactly one of patch and capture_id.")
            return attrs

    @extend_schema(
        operation_id="grading_create",
        request=InputSerializer,
        responses={
            202: inline_serializer("GradingAccepted", {"id": serializers.IntegerField()}),
            **error_responses(404, 409),
        },
    )
    def post(self, request: Request) -> Response:
        data = GradingCreateApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        body = data.validated_data
        job = sandbox_selectors.job_get_for_user(user=request.user, job_id=body["job"])
        task = selectors.task_get(instance_id=body["task"])
        capture = None
        if "capture_id" in body:
            capture = selectors.capture_get_for_user(
                user=request.user, capture_id=body["capture_id"]
            )
        task_set = None
        if "task_set" in body:
            task_set = selectors.task_set_get(task_set_id=body["task_set"])
        grading = services.grading_create(
            job=job,
            task_set=task_set,
            task=task,
            patch=body.get("patch", ""),
            capture=capture,
            suite_names=body.get("suites"),
            shadow=body["shadow"],
            created_by=request.user,
            now=timezone.now(),
        )
        runner = get_runner()
        if runner is not None:
            transaction.on_commit(runner.wake)
        return Response({"id": grading.pk}, status=status.HTTP_202_ACCEPTED)


class GradingOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    job = serializers.IntegerField(source="job_id")
    task = serializers.CharField(source="task.instance_id")
    capture_id = serializers.IntegerField(allow_null=True)
    patch_sha256 = serializers.CharField()
    state = serializers.ChoiceField(choices=GradingState.choices)
    verdict = serializers.CharField(
        allow_blank=True, help_text="resolved | unresolved | no_verdict; empty until done"
    )
    reason = serializers.CharField(allow_blank=True)
    tests = serializers.JSONField(help_text="per-test status (PASSED, FAILED, ...)")
    apply_step = serializers.CharField(allow_blank=True)
    suites = serializers.JSONField()
    attempts = serializers.JSONField(
        help_text="one per sandbox tried: sandbox_id, source, outcome, times, detail"
    )
    shadow_requested = serializers.BooleanField()
    shadow = serializers.JSONField(
        help_text="the shadow grading on a never-used sandbox: sandbox_id, source, verdict "
        "or error, duration_ms; {} until it ran"
    )
    shadow_agrees = serializers.BooleanField(
        allow_null=True, help_text="the shadow's verdict equals this one; null without one"
    )
    created_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)


class GradingDetailApi(JsonApiView):
    """GET /api/v1/gradings/{id}/ — a grading as stored so far (verdict once ``done``)."""

    OutputSerializer = GradingOutputSerializer

    @extend_schema(operation_id="grading_get", responses={200: GradingOutputSerializer})
    def get(self, request: Request, grading_id: int) -> Response:
        grading = selectors.grading_get_for_user(user=request.user, grading_id=grading_id)
        return Response(GradingDetailApi.OutputSerializer(grading).data)
