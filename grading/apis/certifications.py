"""REST views for preflight (start → 202) and certifications (get).

Each APIView is one operation: validate → one service or selector call → serialize.
Rules a reader must not break: the job is looked up as the caller's (someone else's job is a
404) before anything is stored; starting preflight only stores the certification and queues
its first gradings — the grading runner does the work, woken after the commit.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from grading import selectors, services
from grading.runner import get_runner
from grading.states import CertificationState
from sandboxes import selectors as sandbox_selectors
from sandboxes.apis.common import JsonApiView, StrictSerializer
from sandman_site.openapi import error_responses


class CertificationOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    task_set = serializers.IntegerField(source="task_set_id")
    task_set_name = serializers.CharField(source="task_set.name")
    job = serializers.IntegerField(source="job_id")
    state = serializers.ChoiceField(choices=CertificationState.choices)
    config = serializers.JSONField(help_text="the job's grading configuration certified")
    config_hash = serializers.CharField()
    results = serializers.JSONField(
        help_text="per instance_id: digest, admitted (null while undecided), reason, verdicts"
    )
    admitted = serializers.ListField(child=serializers.CharField())
    chain = serializers.CharField(
        allow_blank=True, help_text="SHA-256 chain over the admitted tasks; set when done"
    )
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class TaskSetPreflightApi(JsonApiView):
    """POST /api/v1/task-sets/{id}/preflight/ — certify a task set under a job's configuration
    (each task's reference patch graded twice must resolve, its empty patch must not) → 202."""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "TaskSetPreflightInput"

        job = serializers.IntegerField(min_value=1)

    OutputSerializer = CertificationOutputSerializer

    @extend_schema(
        operation_id="task_set_preflight",
        request=InputSerializer,
        responses={202: CertificationOutputSerializer, **error_responses(409)},
    )
    def post(self, request: Request, task_set_id: int) -> Response:
        data = TaskSetPreflightApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = sandbox_selectors.job_get_for_user(
            user=request.user, job_id=data.validated_data["job"]
        )
        task_set = selectors.task_set_get(task_set_id=task_set_id)
        cert = services.certification_start(
            task_set=task_set, job=job, created_by=request.user, now=timezone.now()
        )
        runner = get_runner()
        if runner is not None:
            transaction.on_commit(runner.wake)
        out = TaskSetPreflightApi.OutputSerializer(cert).data
        return Response(out, status=status.HTTP_202_ACCEPTED)


class CertificationDetailApi(JsonApiView):
    """GET /api/v1/certifications/{id}/ — a certification as stored so far."""

    OutputSerializer = CertificationOutputSerializer

    @extend_schema(operation_id="certification_get", responses={200: CertificationOutputSerializer})
    def get(self, request: Request, certification_id: int) -> Response:
        cert = selectors.certification_get_for_user(
            user=request.user, certification_id=certification_id
        )
        return Response(CertificationDetailApi.OutputSerializer(cert).data)
