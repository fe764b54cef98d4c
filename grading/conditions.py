"""Declared run conditions against execd's ``/probe`` readings (§4.5). Pure: no Django.

Rules a reader must not break:
* Only a READABLE reading that contradicts a declared field refuses the sandbox; an
  unreadable reading is recorded as ``unreadable`` and never trusted either way (it neither
  refuses nor counts as a match). An undeclared field is not compared.
* Each comparison is recorded with both values, so a refusal says what differed.
* ``time_limit_s``: the reading is execd's per-command default; suites send their own
  limit, so only a sandbox whose default is SHORTER than the declaration contradicts it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

MATCH, CONTRADICTION, UNREADABLE = "match", "contradiction", "unreadable"


@dataclass(frozen=True)
class Check:
    field: str
    declared: Any
    read: Any
    outcome: str  # match | contradiction | unreadable
    source: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "declared": self.declared,
            "read": self.read,
            "outcome": self.outcome,
            "source": self.source,
        }


def _egress(declared: Any, read: Any) -> bool:
    return {"deny": "denied", "allow": "open"}.get(declared) == read


def _cpu(declared: Any, read: Any) -> bool:
    return isinstance(read, int | float) and round(read * 1000) == int(declared)


def _exact(declared: Any, read: Any) -> bool:
    return read == declared


def _hash_seed(declared: Any, read: Any) -> bool:
    return read is None if declared == "random" else read == declared


def _time_limit(declared: Any, read: Any) -> bool:
    return isinstance(read, int | float) and read >= float(declared)


# declared field → (probe reading name, does the reading agree?)
_RULES: dict[str, tuple[str, Callable[[Any, Any], bool]]] = {
    "egress": ("egress", _egress),
    "cpu_quota_millis": ("cpu_quota", _cpu),
    "visible_cpus": ("visible_cpus", _exact),
    "memory_limit_bytes": ("memory_limit", _exact),
    "user": ("user", _exact),
    "time_zone": ("time_zone", _exact),
    "hash_seed": ("hash_seed", _hash_seed),
    "time_limit_s": ("time_limit", _time_limit),
}


def check_conditions(
    declared: Mapping[str, Any], readings: Mapping[str, Mapping[str, Any]]
) -> list[Check]:
    """One ``Check`` per declared field, in declaration order."""
    checks = []
    for field, want in declared.items():
        if field not in _RULES:
            continue
        name, agrees = _RULES[field]
        reading = readings.get(name)
        if reading is None or "value" not in reading:
            why = (reading or {}).get("unreadable", f"the probe has no {name!r} reading")
            checks.append(Check(field, want, None, UNREADABLE, str(why)))
            continue
        read = reading["value"]
        outcome = MATCH if agrees(want, read) else CONTRADICTION
        checks.append(Check(field, want, read, outcome, str(reading.get("source", ""))))
    return checks


def refusal(checks: list[Check]) -> str | None:
    """A sentence naming every contradiction, or None when the sandbox may grade."""
    bad = [c for c in checks if c.outcome == CONTRADICTION]
    if not bad:
        return None
    parts = [f"{c.field}: declared {c.declared!r}, read {c.read!r} ({c.source})" for c in bad]
    return "probe refused the sandbox: " + "; ".join(parts)
