"""Kubernetes quantity syntax for resource specs: ``"2"``, ``"500m"``, ``"8Gi"``, ``"1.5"``.

Pure functions, no Django. CPU is held as integer millicores, memory and workspace as
integer bytes, so two specs compare exactly (a warm pod is handed out only on equality).
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(m|Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?\s*$")


class QuantityError(ValueError):
    """The text is not a Kubernetes quantity we accept."""


def _parse(value: object) -> tuple[Decimal, str]:
    if isinstance(value, bool) or value is None:
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int | float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"{value!r} is not a finite quantity")
        text = repr(value) if isinstance(value, float) else str(value)
    elif isinstance(value, str):
        text = value
    else:
        raise QuantityError(f"{value!r} is not a quantity")
    match = _QUANTITY.match(text)
    if not match:
        raise QuantityError(f"{value!r} is not a quantity like '2', '500m' or '8Gi'")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:  # pragma: no cover - regex already checked
        raise QuantityError(f"{value!r} is not a number") from exc
    return number, match.group(2) or ""


def parse_cpu_millis(value: object) -> int:
    """Cores → millicores. ``"2"`` → 2000, ``"500m"`` → 500, ``1.5`` → 1500."""
    number, suffix = _parse(value)
    if suffix == "m":
        millis = number
    elif suffix == "":
        millis = number * 1000
    else:
        raise QuantityError(f"cpu {value!r}: use cores ('2', '0.5') or millicores ('500m')")
    if millis != millis.to_integral_value():
        raise QuantityError(f"cpu {value!r} is finer than one millicore")
    if millis <= 0:
        raise QuantityError(f"cpu {value!r} must be positive")
    return int(millis)


def parse_bytes(value: object, *, what: str = "memory") -> int:
    """``"8Gi"`` → 8589934592, ``"500M"`` → 500000000, ``1024`` → 1024."""
    number, suffix = _parse(value)
    if suffix == "m":
        raise QuantityError(f"{what} {value!r}: millibytes make no sense")
    factor = _BINARY.get(suffix) or _DECIMAL[suffix]
    amount = number * factor
    if amount != amount.to_integral_value():
        raise QuantityError(f"{what} {value!r} is not a whole number of bytes")
    if amount <= 0:
        raise QuantityError(f"{what} {value!r} must be positive")
    return int(amount)


def format_cpu(millis: int) -> str:
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def format_bytes(amount: int) -> str:
    for suffix in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        factor = _BINARY[suffix]
        if amount % factor == 0:
            return f"{amount // factor}{suffix}"
    return str(amount)
