"""REST views for sandboxes: list (filtered, paginated), detail with timeline, release.

Invariant: no response built here ever carries a sandbox's token. The token leaves the
service exactly once, in the acquire answer (``sandboxes.apis.jobs.JobAcquireApi``);
the selectors defer the column and the output serializers do not declare it.
"""

from __future__ import annotations

from typing import Any, cast

from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from sandboxes import selectors
from sandboxes.apis import access, direct, idempotency
from sandboxes.apis.asyncview import AsyncJsonApiView
from sandboxes.apis.common import (
    CONTROLLER_ERRORS,
    JsonApiView,
    SpecOutputSerializer,
    StrictCharField,
    StrictSerializer,
    controller,
)
from sandboxes.models import Sandbox
from sandboxes.services.lifetimes import MAX_RENEW_S, sandbox_renew
from sandboxes.services.offers import KeySeen
from sandboxes.states import Role, SandboxState
from sandman_site.errors import InvalidTransition
from sandman_site.openapi import error_responses
from sandman_site.pagination import Page
from sandman_site.parsers import I64_MAX
from sandman_site.ratelimit import HotRouteThrottle

_VERDICTS = (("pass", "pass"), ("fail", "fail"), ("none", "none"))


class SandboxOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    job = serializers.IntegerField(source="job_id")
    role = serializers.ChoiceField(choices=Role.choices)
    state = serializers.ChoiceField(choices=SandboxState.choices)
    # "source" is a wire field name; DRF's stubs type Field.source as a string attribute.
    source = serializers.CharField(  # type: ignore[assignment]
        help_text="warm | reused | created, or empty before hand-out"
    )
    backend = serializers.CharField()
    image = serializers.CharField()
    base_commit = serializers.CharField(allow_blank=True)
    spec = SpecOutputSerializer(source="*")
    egress = serializers.CharField()
    address = serializers.CharField(allow_blank=True)
    node = serializers.CharField(allow_blank=True)
    guards = serializers.JSONField()
    reuse_count = serializers.IntegerField()
    failure_reason = serializers.CharField(allow_blank=True)
    requested_at = serializers.DateTimeField()
    ready_at = serializers.DateTimeField(allow_null=True)
    acquired_at = serializers.DateTimeField(allow_null=True)
    released_at = serializers.DateTimeField(allow_null=True)
    deleted_at = serializers.DateTimeField(allow_null=True)


class SandboxListApi(JsonApiView):
    """GET /api/v1/sandboxes/?job=&state=&role= — the caller's sandboxes, newest first."""

    class FilterSerializer(serializers.Serializer):
        class Meta:
            ref_name = "SandboxFilter"

        job = serializers.IntegerField(
            min_value=1, max_value=I64_MAX, required=False, help_text="only this job's sandboxes"
        )
        state = serializers.ChoiceField(choices=SandboxState.choices, required=False)
        role = serializers.ChoiceField(choices=Role.choices, required=False)

    OutputSerializer = SandboxOutputSerializer

    @extend_schema(
        operation_id="sandbox_list",
        parameters=[FilterSerializer],
        responses={200: SandboxOutputSerializer(many=True)},
    )
    def get(self, request: Request) -> Response:
        filters = SandboxListApi.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        f = filters.validated_data
        qs = selectors.sandbox_list_for_user(
            user=request.user, job_id=f.get("job"), state=f.get("state"), role=f.get("role")
        )
        paginator = Page()
        page = paginator.paginate_queryset(qs, request, view=self)
        return paginator.get_paginated_response(
            SandboxListApi.OutputSerializer(page, many=True).data
        )


class SandboxEventSerializer(serializers.Serializer):
    at = serializers.DateTimeField()
    kind = serializers.CharField()
    detail = serializers.JSONField()


class SandboxDetailApi(JsonApiView):
    """GET /api/v1/sandboxes/{id}/ — one sandbox, all its timestamps and its event timeline."""

    class OutputSerializer(SandboxOutputSerializer):
        class Meta:
            ref_name = "SandboxDetail"

        key_hash = serializers.CharField()
        agent_used = serializers.BooleanField()
        address_failures = serializers.IntegerField(allow_null=True)
        image_present = serializers.BooleanField(allow_null=True)
        pull_ms = serializers.FloatField(allow_null=True)
        api_created_at = serializers.DateTimeField(allow_null=True)
        scheduled_at = serializers.DateTimeField(allow_null=True)
        address_assigned_at = serializers.DateTimeField(allow_null=True)
        image_pulled_at = serializers.DateTimeField(allow_null=True)
        started_at = serializers.DateTimeField(allow_null=True)
        healthy_at = serializers.DateTimeField(allow_null=True)
        deleting_at = serializers.DateTimeField(allow_null=True)
        events = serializers.SerializerMethodField()

        def get_events(self, sandbox: Sandbox) -> list[dict[str, Any]]:
            rows = selectors.sandbox_events(sandbox_id=sandbox.pk)
            return cast(list[dict[str, Any]], SandboxEventSerializer(rows, many=True).data)

    @extend_schema(operation_id="sandbox_get", responses={200: OutputSerializer})
    def get(self, request: Request, sandbox_id: int) -> Response:
        sandbox = selectors.sandbox_get_for_user(user=request.user, sandbox_id=sandbox_id)
        return Response(SandboxDetailApi.OutputSerializer(sandbox).data)


class ReleaseOutcomeSerializer(StrictSerializer):
    """The grading outcome a trainer reports with a release (checked reuse reads it)."""

    verdict = serializers.ChoiceField(choices=_VERDICTS)
    patch_sha256 = serializers.RegexField(
        r"^[0-9a-f]{64}$",
        max_length=64,
        required=False,
        allow_null=True,
        error_messages={"invalid": "Must be 64 lowercase hex digits."},
    )
    suite = StrictCharField(max_length=200, required=False, allow_null=True)


class SandboxReleaseApi(AsyncJsonApiView):
    """POST /api/v1/sandboxes/{id}/release/ — give the sandbox back, with the grading outcome.

    Async (the hot route): visibility from ``access``, then the body, then the controller.
    Per-token rate: ``sandman_site.ratelimit`` (429 with ``Retry-After``).
    """

    throttle_classes = [HotRouteThrottle]

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "ReleaseInput"

        outcome = ReleaseOutcomeSerializer(required=False, allow_null=True)

    OutputSerializer = inline_serializer(
        "ReleaseOutput",
        fields={"sandbox_id": serializers.IntegerField(), "released": serializers.BooleanField()},
    )

    @extend_schema(
        operation_id="sandbox_release",
        request=InputSerializer,
        responses={200: OutputSerializer, **error_responses(*CONTROLLER_ERRORS)},
    )
    async def post(self, request: Request, sandbox_id: int) -> Response:
        await access.check_sandbox(user=request.user, sandbox_id=sandbox_id)
        key = idempotency.header_key(request)
        data = SandboxReleaseApi.InputSerializer(data=request.data or {})
        data.is_valid(raise_exception=True)
        outcome = data.validated_data.get("outcome") or {}
        answer = await release_answer(sandbox_id=sandbox_id, key=key, outcome=outcome)
        return Response(answer)


async def release_answer(
    *, sandbox_id: int, key: str | None, outcome: dict[str, Any]
) -> dict[str, Any]:
    """The release's answer body, keyed or not (a retried key is a no-op): the view's and
    the ASGI fast path's."""

    async def release(_prior: None = None) -> dict[str, Any]:
        if not await direct.release(sandbox_id=sandbox_id, outcome=outcome):
            await controller().arelease(
                sandbox_id=sandbox_id,
                verdict=outcome.get("verdict"),
                patch_sha256=outcome.get("patch_sha256"),
                suite=outcome.get("suite"),
            )
        access.forget_sandbox(sandbox_id)
        return {"sandbox_id": sandbox_id, "released": True}

    if key is None:
        return await release()
    answer = {"sandbox_id": sandbox_id, "released": True}

    async def released_and_recorded() -> dict[str, Any] | None:
        # A direct release records the key's answer in its own commit; a key with a
        # recorded answer (KeySeen), or a release the controller must make, goes the usual
        # way (read and replay, or call and record).
        try:
            if not await direct.release(
                sandbox_id=sandbox_id,
                outcome=outcome,
                key=key,
                answer=idempotency.recorded_form(answer),
            ):
                return None
        except KeySeen:
            return None
        access.forget_sandbox(sandbox_id)
        return dict(answer)

    return await idempotency.run_once(
        route="release",
        scope=sandbox_id,
        key=key,
        call=release,
        sandbox_of=lambda a: None,
        fast=released_and_recorded,
    )


class SandboxRenewApi(JsonApiView):
    """POST /api/v1/sandboxes/{id}/renew/ — keep an in-use sandbox at least ``ttl_s`` more
    seconds before the reclaim at its job's ``max_lifetime_s`` (409 unless in use)."""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "RenewInput"

        ttl_s = serializers.FloatField(min_value=1, max_value=MAX_RENEW_S)

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "RenewOutput"

        sandbox_id = serializers.IntegerField()
        expires_at = serializers.DateTimeField()

    @extend_schema(
        operation_id="sandbox_renew",
        request=InputSerializer,
        responses={200: OutputSerializer, **error_responses(InvalidTransition)},
    )
    def post(self, request: Request, sandbox_id: int) -> Response:
        selectors.sandbox_get_for_user(user=request.user, sandbox_id=sandbox_id)
        data = SandboxRenewApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        expires = sandbox_renew(
            sandbox_id=sandbox_id, ttl_s=data.validated_data["ttl_s"], now=timezone.now()
        )
        return Response(
            SandboxRenewApi.OutputSerializer({"sandbox_id": sandbox_id, "expires_at": expires}).data
        )
