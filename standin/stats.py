"""Request counts by verb and resource, and open watch streams, readable from any thread.

Tests assert on these ("exactly one watch, no per-pod GET"), so every API handler records
its request before anything else happens, including gates and failure plans.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any


class RequestStats:
    """Requests by verb and resource, and live watch streams; safe to read from any thread."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.log: list[dict[str, Any]] = []
        self.watching = 0

    def record(
        self,
        verb: str,
        resource: str,
        namespace: str,
        name: str,
        query: dict[str, str] | None = None,
    ) -> None:
        """Count one request; ``query`` (e.g. a list's ``limit``/``continue``) joins its log
        entry only when given, so entries of other requests keep their four keys."""
        entry: dict[str, Any] = {
            "verb": verb,
            "resource": resource,
            "namespace": namespace,
            "name": name,
        }
        if query:
            entry["query"] = dict(query)
        with self._cond:
            self.counts[(verb, resource)] += 1
            self.log.append(entry)

    def watch_opened(self) -> None:
        with self._cond:
            self.watching += 1
            self._cond.notify_all()

    def watch_closed(self) -> None:
        with self._cond:
            self.watching -= 1
            self._cond.notify_all()

    def wait_watching(self, n: int, timeout: float, *, exact: bool = False) -> bool:
        """Block until ``n`` watch streams are open (at least ``n``, or exactly ``n``)."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self.watching == n if exact else self.watching >= n, timeout
            )

    def snapshot(self) -> Counter[tuple[str, str]]:
        with self._cond:
            return Counter(self.counts)

    def reset(self) -> None:
        with self._cond:
            self.counts.clear()
            self.log.clear()
