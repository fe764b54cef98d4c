"""Kubernetes quantity syntax for resource specs: ``"2"``, ``"500m"``, ``"8Gi"``, ``"1.5"``.

Parsing is ``kubernetes.utils.parse_quantity``; this module adds what a resource spec
needs on top: the suffixes each resource takes (cpu: cores or ``m``; memory: bytes with a
decimal or binary multiplier), whole millicores and whole bytes, positive, within the
database column, and refusals of what ``parse_quantity`` lets through but is no
Kubernetes quantity (``NaN``, ``Infinity``, ``1_000``, non-ASCII digits). CPU is held as
integer millicores, memory and workspace as integer bytes, so two specs compare exactly (a
warm pod is handed out only on equality).

Invariant: every refusal is a ``QuantityError`` (a ``ValueError``) with a sentence naming the
value - the API turns it into a 400, never a 500.
"""

from __future__ import annotations

from decimal import Decimal, DecimalException

from kubernetes.utils import parse_quantity

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_MEMORY_SUFFIXES = frozenset({"", "k", "M", "G", "T", "P", "E"} | set(_BINARY))
_CPU_SUFFIXES = frozenset({"", "m"})
MAX_CPU_MILLIS = 2**31 - 1  # Sandbox.cpu_millis is a PostgreSQL integer
MAX_BYTES = 2**63 - 1  # memory_bytes / workspace_bytes are PostgreSQL bigints
_BEYOND_64_BITS = Decimal(2**64)


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity we accept."""


def _suffix(text: str) -> str:
    """The multiplier suffix as ``parse_quantity`` reads it ("" for none)."""
    if len(text) >= 2 and text[-1] == "i" and text[-2].isalpha():
        return text[-2:]
    return text[-1] if text and text[-1].isalpha() else ""


def _parse(value: object) -> tuple[Decimal, str]:
    """``(amount, suffix)``: the quantity's value with its multiplier applied."""
    if isinstance(value, bool) or value is None:
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        text = repr(value) if isinstance(value, float) else str(value)  # 0.1 stays 0.1
    elif isinstance(value, str):
        text = value.strip()
    else:
        raise QuantityError(f"{value!r} is not a quantity")
    if not text.isascii() or "_" in text:  # Decimal's digit separators and Unicode digits
        raise QuantityError(f"{value!r} is not a quantity like '2', '500m' or '8Gi'")
    try:
        amount = parse_quantity(text)
    except (ValueError, DecimalException) as exc:
        raise QuantityError(f"{value!r} is not a quantity like '2', '500m' or '8Gi'") from exc
    if not amount.is_finite():
        raise QuantityError(f"{value!r} is not a finite quantity")
    if amount.copy_abs() >= _BEYOND_64_BITS:  # before any arithmetic can overflow Decimal
        raise QuantityError(f"{value!r} is beyond 64 bits")
    return amount, _suffix(text)


def parse_cpu_millis(value: object) -> int:
    """Cores → millicores. ``"2"`` → 2000, ``"500m"`` → 500, ``1.5`` → 1500."""
    cores, suffix = _parse(value)
    if suffix not in _CPU_SUFFIXES:
        raise QuantityError(f"cpu {value!r}: use cores ('2', '0.5') or millicores ('500m')")
    millis = cores * 1000
    if millis != millis.to_integral_value():
        raise QuantityError(f"cpu {value!r} is finer than one millicore")
    if millis <= 0:
        raise QuantityError(f"cpu {value!r} must be positive")
    if millis > MAX_CPU_MILLIS:
        raise QuantityError(f"cpu {value!r} is more than {MAX_CPU_MILLIS} millicores")
    return int(millis)


def parse_bytes(value: object, *, what: str = "memory") -> int:
    """``"8Gi"`` → 8589934592, ``"500M"`` → 500000000, ``1024`` → 1024."""
    amount, suffix = _parse(value)
    if suffix == "m":
        raise QuantityError(f"{what} {value!r}: millibytes make no sense")
    if suffix not in _MEMORY_SUFFIXES:
        raise QuantityError(f"{what} {value!r}: use bytes, 'k'/'M'/'G'... or 'Ki'/'Mi'/'Gi'...")
    if amount != amount.to_integral_value():
        raise QuantityError(f"{what} {value!r} is not a whole number of bytes")
    if amount <= 0:
        raise QuantityError(f"{what} {value!r} must be positive")
    if amount > MAX_BYTES:
        raise QuantityError(f"{what} {value!r} is more than {MAX_BYTES} bytes")
    return int(amount)


def format_cpu(millis: int) -> str:
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def format_bytes(amount: int) -> str:
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        factor = _BINARY[suffix]
        if amount % factor == 0:
            return f"{amount // factor}{suffix}"
    return str(amount)
