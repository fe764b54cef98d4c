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


@pytest.mark.parametrize(
    ("text", "millis"),
    [(" 2 ", 2000), ("+1", 1000), (".5", 500), ("1e-3", 1), (0.1, 100), ("2147483647m", 2**31 - 1)],
)
def test_cpu_takes_the_kubernetes_number_forms(text: object, millis: int) -> None:
    assert parse_cpu_millis(text) == millis


@pytest.mark.parametrize(
    ("text", "amount"),
    [("8 Gi", 8 * 2**30), ("1k", 1000), ("1e3", 1000), ("1E", 10**18), (f"{2**63 - 1}", 2**63 - 1)],
)
def test_memory_takes_the_kubernetes_number_forms(text: object, amount: int) -> None:
    assert parse_bytes(text) == amount


@pytest.mark.parametrize(
    "bad",
    [
        "NaN",
        "Infinity",
        "-Infinity",
        "sNaN",
        "inf",
        float("inf"),
        "1_000",  # Decimal's digit separator: no Kubernetes quantity
        "\u0663",  # ARABIC-INDIC DIGIT THREE: Decimal reads it as 3
        "-500m",
        "1K",  # parse_quantity takes an upper-case K; Kubernetes and we do not
        "1k",
        "1Ki",
        "500u",
        "2000000n",
        "2147483648m",  # past the cpu column
        "1e30",
        10**30,
        "1e100000000",  # past what Decimal arithmetic can hold
    ],
)
def test_cpu_refuses_what_parse_quantity_would_let_through(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_cpu_millis(bad)


@pytest.mark.parametrize(
    "bad",
    [
        "NaN",
        "-Infinity",
        "1_024",
        "\u0663Gi",
        "-1",
        "1K",
        "1000u",
        "1000000000n",
        f"{2**63}",  # past the bigint column
        "16Ei",
        "99999999999999999999999Ei",  # beyond 64 bits
        2**64,
    ],
)
def test_memory_refuses_what_parse_quantity_would_let_through(bad: object) -> None:
    with pytest.raises(QuantityError):
        parse_bytes(bad)


def test_a_refusal_says_what_was_wrong() -> None:
    with pytest.raises(QuantityError, match="finite"):
        parse_cpu_millis("NaN")
    with pytest.raises(QuantityError, match="millicores"):
        parse_cpu_millis("2Gi")
    with pytest.raises(QuantityError, match="beyond 64 bits"):
        parse_bytes("99999999999999999999999Ei")
    with pytest.raises(QuantityError, match="workspace"):
        parse_bytes("1.5", what="workspace")


def test_formatting_round_trips() -> None:
    assert format_cpu(parse_cpu_millis("1500m")) == "1500m"
    assert format_cpu(parse_cpu_millis("2")) == "2"
    assert format_bytes(parse_bytes("8Gi")) == "8Gi"
    assert parse_bytes(format_bytes(123457)) == 123457
