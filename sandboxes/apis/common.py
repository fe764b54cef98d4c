"""Shared serializer pieces of the REST API: strict objects, quantity specs, image checks.

Invariants:
* Every input object is STRICT: an unknown key (a typo such as ``"egres"``) is a 400,
  never silently ignored, so a trainer never runs with a default it meant to override.
* Resource specs use Kubernetes quantity syntax and are turned into exact integers
  (millicores, bytes) here, before anything reaches the controller.
* Validation has no side effects: a rejected request changes nothing.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers
from rest_framework.views import APIView

from sandboxes.addresses import AddressFloorReached
from sandboxes.controller import Controller, PrewarmKey, RemoteController, get_controller
from sandboxes.quantities import (
    QuantityError,
    format_bytes,
    format_cpu,
    parse_bytes,
    parse_cpu_millis,
)
from sandman_site.errors import (
    ControllerUnavailable,
    GuardUnavailable,
    InvalidTransition,
    PoolCapReached,
    ProviderError,
    SandboxNotReady,
    SandmanError,
    UnknownImage,
)
from sandman_site.parsers import BoundedJSONParser

# What a view that calls the controller can answer beyond its configuration (declared in
# the OpenAPI document with ``sandman_site.openapi.error_responses``).
CONTROLLER_ERRORS: tuple[type[SandmanError], ...] = (
    UnknownImage,
    InvalidTransition,
    GuardUnavailable,
    PoolCapReached,
    ProviderError,
    ControllerUnavailable,
    SandboxNotReady,
    AddressFloorReached,
)


class StrictSerializer(serializers.Serializer):
    """A serializer that refuses keys it does not declare (typos are errors)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
        return super().to_internal_value(data)


class StrictCharField(serializers.CharField):
    """A CharField that takes only JSON strings (no silent ``123`` → ``"123"``)."""

    default_error_messages = {"not_a_string": "Must be a string."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("not_a_string")
        return super().to_internal_value(data)


MAX_QUANTITY_CHARS = 64


@extend_schema_field(
    {
        "oneOf": [
            {"type": "string", "example": "500m", "maxLength": MAX_QUANTITY_CHARS},
            {"type": "number", "example": 2},
        ]
    }
)
class QuantityField(serializers.Field):
    """A Kubernetes quantity (``"2"``, ``"500m"``, ``"8Gi"``) parsed to an integer; as a
    string at most ``MAX_QUANTITY_CHARS`` characters."""

    def __init__(self, *, kind: str, **kwargs: Any) -> None:
        self.kind = kind  # "cpu" (→ millicores) or "bytes"
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, str) and len(data) > MAX_QUANTITY_CHARS:
            raise serializers.ValidationError(
                f"Ensure this field has no more than {MAX_QUANTITY_CHARS} characters."
            )
        try:
            if self.kind == "cpu":
                return parse_cpu_millis(data)
            return parse_bytes(data, what=self.field_name or "quantity")
        except QuantityError as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def to_representation(self, value: int) -> str:
        return format_cpu(value) if self.kind == "cpu" else format_bytes(value)


class SpecSerializer(StrictSerializer):
    """``{cpu, memory, workspace?}`` → ``{cpu_millis, memory_bytes, workspace_bytes}``."""

    cpu = QuantityField(kind="cpu", help_text="cores: '2', '0.5' or '500m'")
    memory = QuantityField(kind="bytes", help_text="bytes: '8Gi', '512Mi', '500M'")
    workspace = QuantityField(
        kind="bytes", required=False, allow_null=True, help_text="workspace size: '10Gi'"
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        return {
            "cpu_millis": attrs["cpu"],
            "memory_bytes": attrs["memory"],
            "workspace_bytes": attrs.get("workspace"),
        }


class SpecOutputSerializer(serializers.Serializer):
    cpu = serializers.SerializerMethodField()
    memory = serializers.SerializerMethodField()
    workspace = serializers.SerializerMethodField()

    def get_cpu(self, obj: Any) -> str:
        return format_cpu(obj.cpu_millis)

    def get_memory(self, obj: Any) -> str:
        return format_bytes(obj.memory_bytes)

    def get_workspace(self, obj: Any) -> str | None:
        return format_bytes(obj.workspace_bytes) if obj.workspace_bytes else None


def check_image(image: str, base_commit: str | None) -> None:
    """Refuse an image the backend knows it cannot start, before anything is created.

    The backend judges (``Provider.check_image`` through the controller, no loop needed):
    the local provider knows its template directories; a backend that cannot tell before a
    pull (None) learns of a bad image at pull time, where the create fails.
    """
    if controller().check_image(image, base_commit) is False:
        at = f" at commit {base_commit!r}" if base_commit else ""
        raise UnknownImage(f"Unknown image {image!r}{at}: the backend cannot start it.")


_remote: RemoteController | None = None


def controller() -> Controller | RemoteController:
    """The process-wide controller (built on first use, never at URL loading); in a web
    worker of split processes (``SANDMAN_CONTROLLER_SOCKET``), the controller process."""
    global _remote
    path = settings.SANDMAN_CONTROLLER_SOCKET
    if not path:
        return get_controller()
    if _remote is None or _remote.path != path:
        _remote = RemoteController(path)
    return _remote


def prewarm_key(**fields: Any) -> PrewarmKey:
    return PrewarmKey(**fields)


class JsonApiView(APIView):
    """Base of every trainer view: bodies are JSON only (a form post is a 415, not a guess)."""

    parser_classes = [BoundedJSONParser]
