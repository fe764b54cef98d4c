"""REST views for tasks (create, list, get) and task sets (create, list, get).

Each APIView is one operation: validate → one service or selector call → serialize.
Rule a reader must not break: ``TaskCreateApi.InputSerializer`` is THE reader of the
SWE-bench instance format — the REST create and ``python manage.py import_tasks`` both use
it, so a line the command accepts is a body the API accepts and the stored task is the same.
A rejected body stores nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
)
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from grading import selectors, services
from grading.apis.fields import (
    HEX_COMMIT_RE,
    INSTANCE_ID_RE,
    MAX_TESTS,
    ConditionsSerializer,
    PatchField,
    SuiteSerializer,
    TestListField,
)
from grading.models import (
    DEFAULT_SUITE_TIME_LIMIT_S,
    DEFAULT_TEST_COMMAND,
    TaskSet,
    default_excluded_test_config,
)
from grading.states import TaskState
from sandboxes.apis.common import JsonApiView, StrictCharField, StrictSerializer
from sandman_site.openapi import error_responses
from sandman_site.pagination import Page


class TaskOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    instance_id = serializers.CharField()
    repo = serializers.CharField()
    base_commit = serializers.CharField()
    patch = serializers.CharField()
    test_patch = serializers.CharField()
    FAIL_TO_PASS = serializers.ListField(child=serializers.CharField(), source="fail_to_pass")
    PASS_TO_PASS = serializers.ListField(child=serializers.CharField(), source="pass_to_pass")
    version = serializers.CharField()
    environment_setup_commit = serializers.CharField()
    problem_statement = serializers.CharField()
    image = serializers.CharField()
    suites = serializers.JSONField()
    conditions = serializers.JSONField(
        help_text="declared conditions; quantities as cpu_quota_millis and memory_limit_bytes"
    )
    excluded_test_config = serializers.ListField(child=serializers.CharField())
    state = serializers.ChoiceField(choices=TaskState.choices)
    created_at = serializers.DateTimeField()


class TaskCreateApi(JsonApiView):
    """POST /api/v1/tasks/ — store one task in the SWE-bench instance format (plus ours)."""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "TaskCreateInput"

        instance_id = StrictCharField(max_length=200)
        repo = StrictCharField(max_length=200)
        base_commit = StrictCharField(max_length=64)
        patch = PatchField(help_text="the reference fix")
        test_patch = PatchField(required=False, allow_blank=True, default="")
        FAIL_TO_PASS = TestListField(allow_empty=False)
        PASS_TO_PASS = TestListField(allow_empty=True)
        version = StrictCharField(max_length=50, required=False, allow_blank=True, default="")
        environment_setup_commit = StrictCharField(
            max_length=64, required=False, allow_blank=True, default=""
        )
        problem_statement = StrictCharField(
            max_length=200_000, required=False, allow_blank=True, default="", trim_whitespace=False
        )
        hints_text = serializers.JSONField(required=False, help_text="accepted, not stored")
        created_at = serializers.JSONField(required=False, help_text="accepted, not stored")
        image = StrictCharField(max_length=500, help_text="a digest reference or a local image")
        suites = serializers.ListField(
            child=SuiteSerializer(), required=False, min_length=1, max_length=20
        )
        conditions = ConditionsSerializer(required=False)
        excluded_test_config = serializers.ListField(
            child=StrictCharField(max_length=200), required=False, max_length=100
        )

        def validate_instance_id(self, value: str) -> str:
            if not INSTANCE_ID_RE.match(value):
                raise serializers.ValidationError("letters, digits and . _ : + - only.")
            return value

        def validate_base_commit(self, value: str) -> str:
            if not HEX_COMMIT_RE.match(value):
                raise serializers.ValidationError("a commit id: 7 to 64 lowercase hex digits.")
            return value

        def validate_environment_setup_commit(self, value: str) -> str:
            if value and not HEX_COMMIT_RE.match(value):
                raise serializers.ValidationError("a commit id: 7 to 64 lowercase hex digits.")
            return value

        def validate_image(self, value: str) -> str:
            if not value.strip() or any(ch.isspace() for ch in value):
                raise serializers.ValidationError("an image reference has no whitespace.")
            return value

        def validate_excluded_test_config(self, value: list[str]) -> list[str]:
            for pattern in value:
                parts = pattern.split("/")
                if not pattern or pattern.startswith("/") or ".." in parts:
                    raise serializers.ValidationError(
                        f"{pattern!r}: a file name or a path relative to the repository root."
                    )
            return value

        def validate_suites(self, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
            names = [suite["name"] for suite in value]
            if len(set(names)) != len(names):
                raise serializers.ValidationError("suite names must be unique.")
            return value

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            suites = attrs.get("suites") or [{"name": "default"}]
            return {
                "instance_id": attrs["instance_id"],
                "repo": attrs["repo"],
                "base_commit": attrs["base_commit"],
                "patch": attrs["patch"],
                "test_patch": attrs["test_patch"],
                "fail_to_pass": attrs["FAIL_TO_PASS"],
                "pass_to_pass": attrs["PASS_TO_PASS"],
                "version": attrs["version"],
                "environment_setup_commit": attrs["environment_setup_commit"],
                "problem_statement": attrs["problem_statement"],
                "image": attrs["image"],
                "suites": [
                    {
                        "name": suite["name"],
                        "command": suite.get("command", DEFAULT_TEST_COMMAND),
                        "time_limit_s": suite.get("time_limit_s", DEFAULT_SUITE_TIME_LIMIT_S),
                    }
                    for suite in suites
                ],
                "conditions": dict(attrs.get("conditions") or {}),
                "excluded_test_config": attrs.get(
                    "excluded_test_config", default_excluded_test_config()
                ),
            }

    OutputSerializer = TaskOutputSerializer

    @extend_schema(
        operation_id="task_create",
        request=InputSerializer,
        responses={201: TaskOutputSerializer, **error_responses(409)},
    )
    def post(self, request: Request) -> Response:
        data = TaskCreateApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        task = services.task_create(
            created_by=request.user, now=timezone.now(), fields=data.validated_data
        )
        return Response(TaskCreateApi.OutputSerializer(task).data, status=status.HTTP_201_CREATED)


class TaskListApi(JsonApiView):
    """GET /api/v1/tasks/?task_set=&state= — the task catalogue, by instance_id, paginated."""

    class FilterSerializer(StrictSerializer):
        class Meta:
            ref_name = "TaskFilter"

        task_set = StrictCharField(max_length=200, required=False)
        state = serializers.ChoiceField(choices=TaskState.choices, required=False)
        limit = serializers.IntegerField(min_value=1, max_value=1000, required=False)
        offset = serializers.IntegerField(min_value=0, required=False)

    OutputSerializer = TaskOutputSerializer

    @extend_schema(
        operation_id="task_list",
        parameters=[
            OpenApiParameter(
                "task_set",
                {"type": "string", "maxLength": 200},
                description="only this task set's tasks (by name)",
            ),
            OpenApiParameter("state", str, enum=TaskState.values),
        ],
        responses={200: TaskOutputSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        filters = TaskListApi.FilterSerializer(data=request.query_params.dict())
        filters.is_valid(raise_exception=True)
        qs = selectors.task_list(
            task_set=filters.validated_data.get("task_set"),
            state=filters.validated_data.get("state"),
        )
        paginator = Page()
        page = paginator.paginate_queryset(qs, request, view=self)
        assert page is not None  # REST_FRAMEWORK["PAGE_SIZE"] is set: always a page
        return paginator.get_paginated_response(TaskListApi.OutputSerializer(page, many=True).data)


class TaskCollectionApi(TaskCreateApi, TaskListApi):
    """``/api/v1/tasks/``: GET lists (``TaskListApi``), POST creates (``TaskCreateApi``)."""


class TaskDetailApi(JsonApiView):
    """GET /api/v1/tasks/{instance_id}/ — one task."""

    OutputSerializer = TaskOutputSerializer

    @extend_schema(operation_id="task_get", responses={200: TaskOutputSerializer})
    def get(self, request: Request, instance_id: str) -> Response:
        task = selectors.task_get(instance_id=instance_id)
        return Response(TaskDetailApi.OutputSerializer(task).data)


class TaskSetOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    description = serializers.CharField()
    tasks = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    def get_tasks(self, group: TaskSet) -> list[str]:
        return sorted(task.instance_id for task in group.tasks.all())


class TaskSetCreateApi(JsonApiView):
    """POST /api/v1/task-sets/ — group stored tasks (by instance_id) under a new name."""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "TaskSetCreateInput"

        name = StrictCharField(max_length=200)
        description = StrictCharField(max_length=10_000, required=False, default="")
        tasks = serializers.ListField(
            child=StrictCharField(max_length=200), min_length=1, max_length=MAX_TESTS
        )

    OutputSerializer = TaskSetOutputSerializer

    @extend_schema(
        operation_id="task_set_create",
        request=InputSerializer,
        responses={201: TaskSetOutputSerializer, **error_responses(404, 409)},
    )
    def post(self, request: Request) -> Response:
        data = TaskSetCreateApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        # The answer is read inside the write's transaction: a database lost after its
        # COMMIT must not answer 503 ("nothing was changed") for a stored task set.
        with transaction.atomic():
            group = services.task_set_create(
                created_by=request.user,
                now=timezone.now(),
                name=data.validated_data["name"],
                description=data.validated_data["description"],
                instance_ids=data.validated_data["tasks"],
            )
            out = TaskSetCreateApi.OutputSerializer(group).data
        return Response(out, status=status.HTTP_201_CREATED)


class TaskSetListApi(JsonApiView):
    """GET /api/v1/task-sets/ — every task set with its tasks' instance ids."""

    OutputSerializer = TaskSetOutputSerializer

    @extend_schema(
        operation_id="task_set_list", responses={200: TaskSetOutputSerializer(many=True)}
    )
    def get(self, request: Request) -> Response:
        paginator = Page()
        page = paginator.paginate_queryset(selectors.task_set_list(), request, view=self)
        assert page is not None
        out = TaskSetListApi.OutputSerializer(page, many=True).data
        return paginator.get_paginated_response(out)


class TaskSetCollectionApi(TaskSetCreateApi, TaskSetListApi):
    """``/api/v1/task-sets/``: GET lists, POST creates."""


class TaskSetDetailApi(JsonApiView):
    """GET /api/v1/task-sets/{id}/ — one task set."""

    OutputSerializer = TaskSetOutputSerializer

    @extend_schema(operation_id="task_set_get", responses={200: TaskSetOutputSerializer})
    def get(self, request: Request, task_set_id: int) -> Response:
        group = selectors.task_set_get(task_set_id=task_set_id)
        return Response(TaskSetDetailApi.OutputSerializer(group).data)
