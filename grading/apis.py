"""REST views of the grading app: tasks (create, list, get) and task sets (create, list, get).

Each APIView is one operation: validate → one service or selector call → serialize.
Rules a reader must not break:
* ``TaskCreateApi.InputSerializer`` is THE reader of the SWE-bench instance format: the
  REST create and ``python manage.py import_tasks`` both use it, so a line the command
  accepts is a body the API accepts and the stored task is the same.
* Every field has a bound (lengths, counts, ranges); a rejected body stores nothing.
* ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` arrive as JSON lists or as JSON-encoded strings of
  lists (both as the datasets ship them) and are stored as lists.
"""

from __future__ import annotations

import json
import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response

from grading import selectors, services
from grading.models import (
    DEFAULT_SUITE_TIME_LIMIT_S,
    DEFAULT_TEST_COMMAND,
    PatchCapture,
    TaskSet,
    default_excluded_test_config,
)
from grading.runner import get_runner
from grading.states import GradingState, TaskState
from sandboxes import selectors as sandbox_selectors
from sandboxes.apis.common import JsonApiView, QuantityField, StrictCharField, StrictSerializer
from sandboxes.states import Egress

# A patch larger than this is refused (the reference fixes of SWE-bench are far smaller).
MAX_PATCH_CHARS = 1024 * 1024
MAX_TESTS = 10_000
MAX_TEST_ID_CHARS = 1_000
INSTANCE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,199}$")
HEX_COMMIT_RE = re.compile(r"^[0-9a-f]{7,64}$")
SUITE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
# Keys SWE-bench-family datasets ship that grading does not use: accepted and not stored.
IGNORED_DATASET_KEYS = frozenset({"hints_text", "created_at"})
_DIFF_HEADER = re.compile(r"^(diff --git |--- \S)", re.MULTILINE)
_DIFF_HUNK = re.compile(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", re.MULTILINE)


def looks_like_diff(text: str) -> bool:
    """A unified diff has a file header and at least one hunk (or is a git binary/rename)."""
    if not _DIFF_HEADER.search(text):
        return False
    return bool(_DIFF_HUNK.search(text)) or "\nrename from " in text or "GIT binary patch" in text


class PatchField(StrictCharField):
    """A unified diff, at most ``MAX_PATCH_CHARS`` characters."""

    default_error_messages = {
        **StrictCharField.default_error_messages,
        "not_a_diff": "Not a unified diff (no file header and hunk).",
    }

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", MAX_PATCH_CHARS)
        kwargs.setdefault("trim_whitespace", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        text = super().to_internal_value(data)
        if text and not looks_like_diff(text):
            self.fail("not_a_diff")
        return text


@extend_schema_field(
    {
        "oneOf": [
            {"type": "array", "items": {"type": "string"}},
            {"type": "string", "description": "a JSON-encoded list of test ids"},
        ]
    }
)
class TestListField(serializers.Field):
    """A list of test ids, given as a JSON list or a JSON-encoded string of one."""

    default_error_messages = {
        "not_a_list": "Must be a list of test ids (or a JSON-encoded string of one).",
        "bad_id": "Each test id must be a non-empty string of at most {max} characters.",
        "too_many": "At most {max} test ids.",
        "duplicate": "Test id {test!r} appears twice.",
        "empty": "Must name at least one test.",
    }

    def __init__(self, *, allow_empty: bool, **kwargs: Any) -> None:
        self.allow_empty = allow_empty
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> list[str]:
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError:
                self.fail("not_a_list")
        if not isinstance(data, list):
            self.fail("not_a_list")
        if len(data) > MAX_TESTS:
            self.fail("too_many", max=MAX_TESTS)
        seen: set[str] = set()
        for test in data:
            if not isinstance(test, str) or not test.strip() or len(test) > MAX_TEST_ID_CHARS:
                self.fail("bad_id", max=MAX_TEST_ID_CHARS)
            if test in seen:
                self.fail("duplicate", test=test)
            seen.add(test)
        if not data and not self.allow_empty:
            self.fail("empty")
        return list(data)

    def to_representation(self, value: list[str]) -> list[str]:
        return list(value)


class SuiteSerializer(StrictSerializer):
    name = StrictCharField(max_length=64)
    command = StrictCharField(max_length=4000, required=False, default=DEFAULT_TEST_COMMAND)
    time_limit_s = serializers.FloatField(
        min_value=1, max_value=86_400, required=False, default=DEFAULT_SUITE_TIME_LIMIT_S
    )

    def validate_name(self, value: str) -> str:
        if not SUITE_NAME_RE.match(value):
            raise serializers.ValidationError("lowercase letters, digits, '_' and '-' only.")
        return value


class ConditionsSerializer(StrictSerializer):
    """Declared run conditions (§4.5). An omitted field is not declared, hence not checked."""

    egress = serializers.ChoiceField(choices=Egress.choices, required=False)
    cpu_quota = QuantityField(kind="cpu", required=False, help_text="cores: '2' or '500m'")
    visible_cpus = serializers.IntegerField(min_value=1, max_value=4096, required=False)
    memory_limit = QuantityField(kind="bytes", required=False, help_text="bytes: '4Gi'")
    user = StrictCharField(max_length=64, required=False)
    time_zone = StrictCharField(max_length=64, required=False)
    hash_seed = StrictCharField(
        max_length=10, required=False, help_text="'random' or 0..4294967295"
    )
    time_limit_s = serializers.FloatField(min_value=1, max_value=86_400, required=False)

    def validate_time_zone(self, value: str) -> str:
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise serializers.ValidationError(f"Unknown time zone {value!r}.") from exc
        return value

    def validate_hash_seed(self, value: str) -> str:
        if value == "random" or (value.isdigit() and int(value) <= 4_294_967_295):
            return value
        raise serializers.ValidationError("'random' or an integer 0..4294967295 (PYTHONHASHSEED).")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        out = dict(attrs)
        if "cpu_quota" in out:
            out["cpu_quota_millis"] = out.pop("cpu_quota")
        if "memory_limit" in out:
            out["memory_limit_bytes"] = out.pop("memory_limit")
        return out


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
        operation_id="task_create", request=InputSerializer, responses={201: TaskOutputSerializer}
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
            OpenApiParameter("task_set", str, description="only this task set's tasks (by name)"),
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
        paginator = LimitOffsetPagination()
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
        responses={201: TaskSetOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        data = TaskSetCreateApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
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
        paginator = LimitOffsetPagination()
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
        responses={201: CaptureOutputSerializer},
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

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            if ("patch" in attrs) == ("capture_id" in attrs):
                raise serializers.ValidationError("give exactly one of patch and capture_id.")
            return attrs

    @extend_schema(
        operation_id="grading_create",
        request=InputSerializer,
        responses={202: inline_serializer("GradingAccepted", {"id": serializers.IntegerField()})},
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
        grading = services.grading_create(
            job=job,
            task=task,
            patch=body.get("patch", ""),
            capture=capture,
            suite_names=body.get("suites"),
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
