"""Serializer fields of the grading REST API: patches, test lists, suites, run conditions.

Rules a reader must not break: every field has a bound (length, count, range); a patch is a
unified diff of at most ``MAX_PATCH_CHARS``; ``FAIL_TO_PASS``/``PASS_TO_PASS`` arrive as JSON
lists or JSON-encoded strings of lists (both as the datasets ship them) and leave as lists.
"""

from __future__ import annotations

import json
import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from drf_spectacular.utils import (
    extend_schema_field,
)
from rest_framework import serializers

from grading.models import (
    DEFAULT_SUITE_TIME_LIMIT_S,
    DEFAULT_TEST_COMMAND,
)
from sandboxes.apis.common import QuantityField, StrictCharField, StrictSerializer
from sandboxes.states import Egress

# A patch larger than this is refused (the reference fixes of SWE-bench are far smaller).
MAX_PATCH_CHARS = 1024 * 1024
MAX_TESTS = 10_000
MAX_TEST_ID_CHARS = 1_000
# The JSON-encoded form: at most the API's request body (SANDMAN_API_MAX_BODY_BYTES default).
MAX_TEST_LIST_CHARS = 8 * 1024 * 1024
INSTANCE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:+-]{0,199}$")
HEX_COMMIT_RE = re.compile(r"^[0-9a-f]{7,64}$")
SUITE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
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
            {
                "type": "array",
                "items": {"type": "string", "minLength": 1, "maxLength": MAX_TEST_ID_CHARS},
                "maxItems": MAX_TESTS,
            },
            {
                "type": "string",
                "description": "a JSON-encoded list of test ids",
                "maxLength": MAX_TEST_LIST_CHARS,
            },
        ]
    }
)
class TestListField(serializers.Field):
    """A list of test ids, given as a JSON list or a JSON-encoded string of one."""

    default_error_messages = {
        "not_a_list": "Must be a list of test ids (or a JSON-encoded string of one).",
        "bad_id": "Each test id must be a non-empty string of at most {max} characters.",
        "too_many": "At most {max} test ids.",
        "too_long": "A JSON-encoded list of test ids is at most {max} characters.",
        "duplicate": "Test id {test!r} appears twice.",
        "empty": "Must name at least one test.",
    }

    def __init__(self, *, allow_empty: bool, **kwargs: Any) -> None:
        self.allow_empty = allow_empty
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> list[str]:
        if isinstance(data, str):
            if len(data) > MAX_TEST_LIST_CHARS:
                self.fail("too_long", max=MAX_TEST_LIST_CHARS)
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
