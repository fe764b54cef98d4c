"""Kubernetes quantity parsing for resource specs."""

from __future__ import annotations

import pytest

from sandboxes.quantities import (
    QuantityError,
    format_bytes,
    format_cpu,
    parse_bytes,
    parse_cpu_millis,
)


@pytest.mark.parametrize(
    ("text", "millis"), [("2", 2000), ("500m", 500), (1.5, 1500), (1, 1000), ("0.25", 250)]
)
def test_cpu_accepts_cores_and_millicores(text: object, millis: int) -> None:
    assert parse_cpu_millis(text) == millis


@pytest.mark.parametrize(
    ("text", "amount"),
    [("8Gi", 8 * 2**30), ("512Mi", 512 * 2**20), ("500M", 500_000_000), (1024, 1024)],
)
def test_memory_accepts_binary_and_decimal_suffixes(text: object, amount: int) -> None:
    assert parse_bytes(text) == amount


@pytest.mark.parametrize(
    "bad", ["2 cores", "-1", "0", "8Gx", "", None, True, [], "1.0001", float("nan")]
)
def test_malformed_cpu_is_refused(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_cpu_millis(bad)


@pytest.mark.parametrize("bad", ["8Gx", "-8Gi", "0", "1.5", "100m", "lots", None])
def test_malformed_memory_is_refused(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_bytes(bad)


def test_formatting_round_trips() -> None:
    assert format_cpu(parse_cpu_millis("1500m")) == "1500m"
    assert format_cpu(parse_cpu_millis("2")) == "2"
    assert format_bytes(parse_bytes("8Gi")) == "8Gi"
    assert parse_bytes(format_bytes(123457)) == 123457
