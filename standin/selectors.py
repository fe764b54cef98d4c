"""Label and field selectors as the API server parses them (the subset clients send).

Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k in (a,b)``, ``k notin (a,b)``, ``k``
(exists) and ``!k`` (does not exist), joined by commas. ``!=`` and ``notin`` also match
objects that lack the key, as in Kubernetes. Field selectors: ``path=v`` / ``path!=v``
on dotted paths such as ``metadata.name`` or ``status.phase``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


class SelectorError(ValueError):
    """The selector text does not parse; the server answers 400."""


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        # "!=" and "notin" match a missing key too.
        return not present or value not in self.values


_KEY = r"[A-Za-z0-9][A-Za-z0-9._/-]*"
_EXISTS = re.compile(rf"^(!?)\s*({_KEY})$")
_EQUALITY = re.compile(rf"^({_KEY})\s*(==|=|!=)\s*([A-Za-z0-9._-]*)$")
_SET = re.compile(rf"^({_KEY})\s+(in|notin)\s*\(([^()]*)\)$")


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    current: list[str] = []
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append("".join(current))
            current = []
        else:
            current.append(char)
    terms.append("".join(current))
    return [t.strip() for t in terms if t.strip()]


def parse_label_selector(text: str | None) -> tuple[Requirement, ...]:
    if not text:
        return ()
    requirements = []
    for term in _split_terms(text):
        if m := _SET.match(term):
            values = frozenset(v.strip() for v in m.group(3).split(",") if v.strip())
            requirements.append(Requirement(m.group(1), m.group(2), values))
        elif m := _EQUALITY.match(term):
            op = "!=" if m.group(2) == "!=" else "="
            requirements.append(Requirement(m.group(1), op, frozenset([m.group(3)])))
        elif m := _EXISTS.match(term):
            requirements.append(Requirement(m.group(2), "!exists" if m.group(1) else "exists"))
        else:
            raise SelectorError(f"unable to parse requirement: {term!r}")
    return tuple(requirements)


def labels_match(requirements: tuple[Requirement, ...], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in requirements)


@dataclass(frozen=True)
class FieldRequirement:
    path: tuple[str, ...]
    negate: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        current: Any = obj
        for part in self.path:
            current = current.get(part) if isinstance(current, Mapping) else None
        text = "" if current is None else str(current)
        return (text != self.value) if self.negate else (text == self.value)


def parse_field_selector(text: str | None) -> tuple[FieldRequirement, ...]:
    if not text:
        return ()
    out = []
    for term in _split_terms(text):
        m = re.match(r"^([A-Za-z0-9_.]+)\s*(==|=|!=)\s*(.*)$", term)
        if not m:
            raise SelectorError(f"unable to parse field requirement: {term!r}")
        out.append(FieldRequirement(tuple(m.group(1).split(".")), m.group(2) == "!=", m.group(3)))
    return tuple(out)


def fields_match(requirements: tuple[FieldRequirement, ...], obj: Mapping[str, Any]) -> bool:
    return all(r.matches(obj) for r in requirements)
