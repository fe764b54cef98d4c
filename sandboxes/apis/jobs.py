"""REST views for jobs: create, list, get (with counts), acquire, prewarm, drain.

Each APIView is one operation: validate → one service / selector / controller call →
serialize. Ownership is checked FIRST through ``sandboxes.selectors`` (404 for others'
jobs, whatever the body; the async acquire asks ``access``, which applies the selectors'
rule from memory);
the controller is imported lazily so URL loading never builds a provider.
Defaults of an omitted policy come from the ``Job`` model's field defaults, the one
place they are written down.
"""

from __future__ import annotations

from typing import Any

from django.db import models
from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from sandboxes import selectors
from sandboxes.apis import access, direct, idempotency
from sandboxes.apis.asyncview import AsyncJsonApiView, validate_off_loop
from sandboxes.apis.common import (
    CONTROLLER_ERRORS,
    JsonApiView,
    SpecSerializer,
    StrictCharField,
    StrictSerializer,
    check_image,
    controller,
    prewarm_key,
)
from sandboxes.controller.runtime import AcquireResult
from sandboxes.models import Job
from sandboxes.services.jobs import job_delete
from sandboxes.services.offers import KeySeen
from sandboxes.services.recovery import Recovered, acquisition_recover
from sandboxes.states import Egress, Role, SandboxSource
from sandman_site.errors import AcquireTimeout, JobNotDrained
from sandman_site.openapi import error_responses
from sandman_site.ratelimit import HotRouteThrottle


def _default(field: str) -> Any:
    model_field = Job._meta.get_field(field)
    assert isinstance(model_field, models.Field)
    return model_field.default


# --- job create / list / get --------------------------------------------------------------


class TrainerPodSerializer(StrictSerializer):
    name = StrictCharField(max_length=253)
    uid = StrictCharField(max_length=64)


class PacingSerializer(StrictSerializer):
    rate_per_s = serializers.FloatField(min_value=0.001, max_value=10_000, required=False)
    burst = serializers.IntegerField(min_value=1, max_value=10_000, required=False)


class CapsSerializer(StrictSerializer):
    max_live = serializers.IntegerField(min_value=1, max_value=1_000_000, required=False)
    max_creating = serializers.IntegerField(min_value=1, max_value=100_000, required=False)


class WarmSerializer(StrictSerializer):
    per_key = serializers.IntegerField(min_value=0, max_value=10_000, required=False)
    idle_timeout_s = serializers.FloatField(min_value=0.001, max_value=86_400, required=False)


class ReuseSerializer(StrictSerializer):
    enabled = serializers.BooleanField(required=False)
    # Paper §4.3 / Appendix I: a pod is reused at most 8 times.
    max_uses = serializers.IntegerField(min_value=1, max_value=8, required=False)
    # §4.3: only a digest fixes the image; tag-referenced images need this opt-in for
    # grading prewarm and reuse (sandboxes.imagerefs).
    allow_tag_images = serializers.BooleanField(required=False)


class PlacementSerializer(StrictSerializer):
    node_pool = StrictCharField(
        max_length=63,
        required=False,
        allow_blank=True,
        help_text="value of the service's node-pool label (SANDMAN_K8S_NODE_POOL_LABEL); "
        "empty: the default pool",
    )
    node_selector = serializers.DictField(
        child=StrictCharField(max_length=63, allow_blank=True),
        required=False,
        help_text="other node labels; an instance-type label is refused "
        "(instance_type_selector, paper Table A14)",
    )


class JobOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    state = serializers.CharField(help_text="active | draining | drained")
    owner = serializers.CharField(source="owner.get_username")
    trainer_pod = serializers.SerializerMethodField()
    pacing = serializers.SerializerMethodField()
    caps = serializers.SerializerMethodField()
    warm = serializers.SerializerMethodField()
    egress = serializers.ChoiceField(choices=Egress.choices)
    readiness_budget_s = serializers.FloatField()
    max_lifetime_s = serializers.FloatField()
    reuse = serializers.SerializerMethodField()
    placement = serializers.SerializerMethodField()
    startup_script = serializers.CharField(
        help_text="run first in every execd session of the job's sandboxes (empty: none)"
    )
    created_at = serializers.DateTimeField()
    drained_at = serializers.DateTimeField(allow_null=True)
    counts = serializers.SerializerMethodField()

    def get_trainer_pod(self, job: Job) -> dict[str, str] | None:
        if not job.trainer_pod_name:
            return None
        return {"name": job.trainer_pod_name, "uid": job.trainer_pod_uid}

    def get_pacing(self, job: Job) -> dict[str, float]:
        return {"rate_per_s": job.rate_per_s, "burst": job.burst}

    def get_caps(self, job: Job) -> dict[str, int]:
        return {"max_live": job.max_live, "max_creating": job.max_creating}

    def get_warm(self, job: Job) -> dict[str, float]:
        return {"per_key": job.warm_per_key, "idle_timeout_s": job.idle_timeout_s}

    def get_reuse(self, job: Job) -> dict[str, Any]:
        return {
            "enabled": job.reuse_enabled,
            "max_uses": job.reuse_max_uses,
            "allow_tag_images": job.reuse_allow_tags,
        }

    def get_placement(self, job: Job) -> dict[str, Any]:
        return {"node_pool": job.node_pool, "node_selector": dict(job.node_selector or {})}

    def get_counts(self, job: Job) -> dict[str, int]:
        counts = self.context.get("counts", {}).get(job.pk)
        if counts is None:
            counts = selectors.job_counts(job_id=job.pk)
        return {"live": counts.live, "warm": counts.warm, "creating": counts.creating}


class JobCreateApi(JsonApiView):
    """POST /api/v1/jobs/ — register a job and its pool policy."""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "JobCreateInput"

        name = StrictCharField(max_length=200)
        trainer_pod = TrainerPodSerializer(required=False, allow_null=True)
        pacing = PacingSerializer(required=False)
        caps = CapsSerializer(required=False)
        warm = WarmSerializer(required=False)
        egress = serializers.ChoiceField(choices=Egress.choices)
        readiness_budget_s = serializers.FloatField(
            min_value=0.001, max_value=86_400, required=False
        )
        max_lifetime_s = serializers.FloatField(min_value=1, max_value=7 * 86_400, required=False)
        reuse = ReuseSerializer(required=False)
        placement = PlacementSerializer(required=False)
        startup_script = StrictCharField(
            required=False,
            allow_blank=True,
            trim_whitespace=False,
            max_length=64 * 1024,
            help_text="a bash script execd runs first in every session's shell of the job's "
            "sandboxes (the BASH_ENV / conda activate case); at most 64 KiB",
        )

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            pod = attrs.get("trainer_pod") or {}
            pacing = attrs.get("pacing") or {}
            caps = attrs.get("caps") or {}
            warm = attrs.get("warm") or {}
            reuse = attrs.get("reuse") or {}
            place = attrs.get("placement") or {}
            out = {
                "name": attrs["name"],
                "trainer_pod_name": pod.get("name", ""),
                "trainer_pod_uid": pod.get("uid", ""),
                "rate_per_s": pacing.get("rate_per_s", _default("rate_per_s")),
                "burst": pacing.get("burst", _default("burst")),
                "max_live": caps.get("max_live", _default("max_live")),
                "max_creating": caps.get("max_creating", _default("max_creating")),
                "warm_per_key": warm.get("per_key", _default("warm_per_key")),
                "idle_timeout_s": warm.get("idle_timeout_s", _default("idle_timeout_s")),
                "readiness_budget_s": attrs.get(
                    "readiness_budget_s", _default("readiness_budget_s")
                ),
                "max_lifetime_s": attrs.get("max_lifetime_s", _default("max_lifetime_s")),
                "egress": attrs["egress"],
                "reuse_enabled": reuse.get("enabled", _default("reuse_enabled")),
                "reuse_max_uses": reuse.get("max_uses", _default("reuse_max_uses")),
                "reuse_allow_tags": reuse.get("allow_tag_images", _default("reuse_allow_tags")),
                "node_pool": place.get("node_pool", ""),
                "node_selector": dict(place.get("node_selector") or {}),
                "startup_script": attrs.get("startup_script", ""),
            }
            return out

    OutputSerializer = JobOutputSerializer

    @extend_schema(
        operation_id="job_create",
        request=InputSerializer,
        responses={201: JobOutputSerializer},
    )
    def post(self, request: Request) -> Response:
        from sandboxes.services.jobs import job_create

        data = JobCreateApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        job = job_create(owner=request.user, now=timezone.now(), **data.validated_data)
        # Built from what the transaction wrote, with no query after its COMMIT: a database
        # lost between the two would otherwise answer 503 for a job that was stored.
        counts = {job.pk: selectors.JobCounts(live=0, warm=0, creating=0)}
        body = JobCreateApi.OutputSerializer(job, context={"counts": counts}).data
        return Response(body, status=status.HTTP_201_CREATED)


class JobListApi(JsonApiView):
    """GET /api/v1/jobs/ — the caller's jobs, newest first, paginated."""

    OutputSerializer = JobOutputSerializer

    @extend_schema(operation_id="job_list", responses={200: JobOutputSerializer(many=True)})
    def get(self, request: Request) -> Response:
        from sandman_site.pagination import Page

        paginator = Page()
        qs = selectors.job_list_for_user(user=request.user).select_related("owner")
        page = paginator.paginate_queryset(qs, request, view=self)
        assert page is not None  # REST_FRAMEWORK["PAGE_SIZE"] is set: always a page
        counts = selectors.job_counts_many(job_ids=[job.pk for job in page])
        out = JobListApi.OutputSerializer(page, many=True, context={"counts": counts})
        return paginator.get_paginated_response(out.data)


class JobCollectionApi(JobCreateApi, JobListApi):
    """``/api/v1/jobs/``: GET lists (``JobListApi``), POST creates (``JobCreateApi``)."""


class JobDetailApi(JsonApiView):
    """GET /api/v1/jobs/{id}/ — one job with its live, warm and creating counts;
    DELETE — forget a drained job and its records (409 ``job_not_drained`` before)."""

    OutputSerializer = JobOutputSerializer

    @extend_schema(operation_id="job_get", responses={200: JobOutputSerializer})
    def get(self, request: Request, job_id: int) -> Response:
        job = selectors.job_get_for_user(user=request.user, job_id=job_id)
        return Response(JobDetailApi.OutputSerializer(job).data)

    @extend_schema(
        operation_id="job_delete", responses={204: None, **error_responses(JobNotDrained)}
    )
    def delete(self, request: Request, job_id: int) -> Response:
        selectors.job_get_for_user(user=request.user, job_id=job_id)
        job_delete(job_id=job_id)
        return Response(status=204)


# --- acquire / prewarm / drain ------------------------------------------------------------


def _image_key(attrs: dict[str, Any]) -> dict[str, Any]:
    """``image``, ``base_commit`` (blank -> None) and the spec's fields, flat, once the
    image (and commit) passed ``check_image``: the part of a sandbox key an acquire and a
    prewarm key share."""
    base_commit = attrs.get("base_commit") or None
    check_image(attrs["image"], base_commit)
    return {"image": attrs["image"], "base_commit": base_commit, **attrs["spec"]}


class JobAcquireApi(AsyncJsonApiView):
    """POST /api/v1/jobs/{id}/acquire/ — a warm, reused or new sandbox for one worker.

    With an ``Idempotency-Key`` header a retry gets the first call's sandbox, never a
    second one (``sandboxes.apis.idempotency``).

    Async (the hot route): ownership from ``access``, then the body, then the controller.
    Per-token rate: ``sandman_site.ratelimit`` (429 with ``Retry-After``).
    """

    throttle_classes = [HotRouteThrottle]

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "AcquireInput"

        image = StrictCharField(max_length=512)
        base_commit = StrictCharField(max_length=64, required=False, allow_null=True)
        spec = SpecSerializer()
        role = serializers.ChoiceField(choices=Role.choices, required=False, default=Role.ROLLOUT)
        timeout_s = serializers.FloatField(
            min_value=0.001, max_value=3600, required=False, allow_null=True
        )

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            return {**_image_key(attrs), "role": attrs["role"], "timeout_s": attrs.get("timeout_s")}

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "AcquireOutput"

        sandbox_id = serializers.IntegerField()
        name = serializers.CharField()
        address = serializers.CharField(help_text="host:port of execd (pod IP, never a Service)")
        token = serializers.CharField(help_text="Bearer token for execd; shown only here")
        # "source" is a wire field name (see sandboxes.py).
        source = serializers.ChoiceField(choices=SandboxSource.choices)  # type: ignore[assignment]
        wait_ms = serializers.FloatField()
        queue_ms = serializers.FloatField()

    @extend_schema(
        operation_id="job_acquire",
        request=InputSerializer,
        responses={200: OutputSerializer, **error_responses(*CONTROLLER_ERRORS, AcquireTimeout)},
    )
    async def post(self, request: Request, job_id: int) -> Response:
        await access.check_job(user=request.user, job_id=job_id)
        key = idempotency.header_key(request)  # a malformed key: 400 before anything runs
        body = request.data
        data = JobAcquireApi.InputSerializer(data=body)
        # Resolving a base commit runs git: off the event loop.
        await validate_off_loop(
            data, off_loop=isinstance(body, dict) and bool(body.get("base_commit"))
        )
        answer = await acquire_answer(
            job_id=job_id, user_id=request.user.pk, key=key, fields=data.validated_data
        )
        return Response(answer)


async def acquire_answer(
    *, job_id: int, user_id: int | None, key: str | None, fields: dict[str, Any]
) -> dict[str, Any]:
    """The acquire's answer body, keyed or not: the view's and the ASGI fast path's.

    With a key, the call runs once per key (``idempotency.run_once``), and an earlier call
    whose answer a restart cut gets that call's sandbox (``acquisition_recover``)."""

    async def acquire(recovered: Recovered | None = None) -> dict[str, Any]:
        # With a key, an earlier call may hold a sandbox whose answer a restart cut
        # (sandboxes.services.recovery, read with the recorded answer): that one, never
        # a second.
        if recovered is not None:
            access.remember_sandbox(sandbox_id=recovered.sandbox_id, job_id=job_id)
            return _recovered_answer(recovered)
        result = await direct.claim(
            job_id=job_id, user_id=user_id, idempotency_key=key or "", fields=fields
        )
        if result is None:  # nothing offered (or the direct hand-out is off)
            result = await controller().aacquire(
                job_id=job_id, user_id=user_id, idempotency_key=key or "", **fields
            )
        access.remember_sandbox(sandbox_id=result.sandbox_id, job_id=job_id)
        return acquire_body(result)

    if key is None:
        return await acquire()

    async def claimed_and_recorded() -> dict[str, Any] | None:
        # A direct claim reads the key's history with its lock and records the answer in
        # its commit; a key with a history (KeySeen), or no offered pod, goes the usual way.
        try:
            result = await direct.claim(
                job_id=job_id,
                user_id=user_id,
                idempotency_key=key,
                fields=fields,
                record_answer=lambda r: idempotency.recorded_form(acquire_body(r)),
            )
        except KeySeen:
            return None
        if result is None:
            return None
        access.remember_sandbox(sandbox_id=result.sandbox_id, job_id=job_id)
        return acquire_body(result)

    return await idempotency.run_once(
        route="acquire",
        scope=job_id,
        key=key,
        call=acquire,
        sandbox_of=lambda a: int(a["sandbox_id"]),
        before=lambda: acquisition_recover(job_id=job_id, key=key, now=timezone.now()),
        fast=claimed_and_recorded,
    )


def acquire_body(result: AcquireResult) -> dict[str, Any]:
    """``JobAcquireApi.OutputSerializer(result).data``, built without a serializer instance
    (DRF deep-copies its declared fields per instance: ~0.2 ms of the hot route's CPU).
    The serializer stays the schema; a test holds the two equal for every source."""
    return {
        "sandbox_id": int(result.sandbox_id),
        "name": str(result.name),
        "address": str(result.address),
        "token": str(result.token),
        "source": str(result.source),
        "wait_ms": float(result.wait_ms),
        "queue_ms": float(result.queue_ms),
    }


def _recovered_answer(recovered: Recovered) -> dict[str, Any]:
    return acquire_body(
        AcquireResult(
            sandbox_id=recovered.sandbox_id,
            name=recovered.name,
            address=recovered.address,
            token=recovered.token,
            source=recovered.source,
            wait_ms=0.0,
            queue_ms=0.0,
        )
    )


class PrewarmKeySerializer(StrictSerializer):
    image = StrictCharField(max_length=512)
    base_commit = StrictCharField(max_length=64, required=False, allow_null=True)
    spec = SpecSerializer()
    count = serializers.IntegerField(min_value=1, max_value=10_000)
    role = serializers.ChoiceField(choices=Role.choices, required=False, default=Role.ROLLOUT)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return {**_image_key(attrs), "count": attrs["count"], "role": attrs["role"]}


_ACCEPTED = inline_serializer(
    "Accepted",
    fields={"job_id": serializers.IntegerField(), "accepted": serializers.BooleanField()},
)


class JobPrewarmApi(JsonApiView):
    """POST /api/v1/jobs/{id}/prewarm/ — build warm pods per key; answers 202 at once."""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "PrewarmInput"

        # many=True builds a ListSerializer, which takes max_length; the stubs do not know.
        keys = PrewarmKeySerializer(  # type: ignore[call-arg]
            many=True, allow_empty=False, max_length=256
        )

    @extend_schema(
        operation_id="job_prewarm",
        request=InputSerializer,
        responses={202: _ACCEPTED, **error_responses(*CONTROLLER_ERRORS)},
    )
    def post(self, request: Request, job_id: int) -> Response:
        job = selectors.job_get_for_user(user=request.user, job_id=job_id)
        data = JobPrewarmApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        keys = [prewarm_key(**key) for key in data.validated_data["keys"]]
        controller().prewarm(job_id=job.pk, keys=keys)
        return Response({"job_id": job.pk, "accepted": True}, status=status.HTTP_202_ACCEPTED)


class JobDrainApi(JsonApiView):
    """POST /api/v1/jobs/{id}/drain/ — delete everything of the job; answers 202 at once."""

    class InputSerializer(StrictSerializer):
        class Meta:
            ref_name = "DrainInput"

    @extend_schema(
        operation_id="job_drain",
        request=None,
        responses={202: _ACCEPTED, **error_responses(400, *CONTROLLER_ERRORS)},
    )
    def post(self, request: Request, job_id: int) -> Response:
        job = selectors.job_get_for_user(user=request.user, job_id=job_id)
        data = JobDrainApi.InputSerializer(data=request.data or {})
        data.is_valid(raise_exception=True)
        controller().drain(job_id=job.pk)
        return Response({"job_id": job.pk, "accepted": True}, status=status.HTTP_202_ACCEPTED)
