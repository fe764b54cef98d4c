"""The stand-in's event log: what the kubelet, scheduler and garbage collector did.

Shaped like ``v1.Event`` essentials (reason, type, involved object, message, node) so
dashboards and tests read it the way they would read a real cluster's events. Bounded:
the oldest entries go first; counters by reason are never dropped.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from typing import Any


class EventLog:
    def __init__(self, now: Callable[[], str], limit: int = 100_000) -> None:
        self._now = now
        self._events: deque[dict[str, Any]] = deque(maxlen=limit)
        self.counts: Counter[str] = Counter()

    def add(
        self,
        reason: str,
        obj: dict[str, Any],
        message: str,
        *,
        type: str = "Normal",
        node: str | None = None,
    ) -> None:
        meta = obj.get("metadata", {})
        self.counts[reason] += 1
        self._events.append(
            {
                "time": self._now(),
                "type": type,
                "reason": reason,
                "object": {
                    "kind": obj.get("kind", ""),
                    "namespace": meta.get("namespace", ""),
                    "name": meta.get("name", ""),
                    "uid": meta.get("uid", ""),
                },
                "message": message,
                "node": node,
            }
        )

    def list(self) -> list[dict[str, Any]]:
        return list(self._events)
