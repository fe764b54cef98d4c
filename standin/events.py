"""The stand-in's core/v1 Events: what its scheduler, kubelet and GC record, as a cluster does.

Each :meth:`EventLog.add` becomes a ``v1.Event`` object in the events store (its own store,
like clusters that keep ``/events`` in a separate etcd: its resourceVersions are its own),
served by the API server at ``/api/v1/namespaces/{ns}/events`` and ``/api/v1/events``.

The recording follows client-go's ``tools/record`` event correlator, which the kubelet uses:

* dedupe: an event equal to an earlier one in source, involved object, type, reason and
  message bumps that Event's ``count`` and ``lastTimestamp`` instead of making a new one;
* aggregation: from the 10th *similar* event (same key except the message) within 10
  minutes on, the message becomes ``(combined from similar events): <latest>`` and further
  ones bump that combined Event's count;
* spam filter: per source and involved object a token bucket (burst 25, one token per 5
  minutes) -- events beyond it are dropped, never stored;
* TTL: an Event is deleted ``ttl_s`` (default 1 h, kube-apiserver ``--event-ttl``) after
  its last write, on the simulated clock; :meth:`EventLog.expire` runs before every read.

The scheduler records through the events.k8s.io/v1 API, so its Events carry ``eventTime``
(microseconds), ``reportingController`` data and ``series`` for repeats, and no
``firstTimestamp`` / ``count``; the kubelet's carry ``source``, whole-second timestamps and
``count``. Counters by reason (``counts``) include dropped events and are never reset.
"""

from __future__ import annotations

import datetime as dt
import heapq
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from standin.status import rfc3339
from standin.store import Obj, Store

SCHEDULER = "default-scheduler"
KUBELET = "kubelet"
COMBINED = "(combined from similar events): "
_SIMILAR_MAX, _SIMILAR_WINDOW_S = 10, 600.0
_SPAM_BURST, _SPAM_REFILL_S = 25, 300.0


def go_duration(seconds: float) -> str:
    """``time.Duration.String()`` of a duration truncated to milliseconds (``3.2s``,
    ``512ms``, ``1m4.25s``), as the kubelet prints pull times."""
    ms = int(seconds * 1000)
    if ms == 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    out = f"{hours}h" if hours else ""
    out += f"{minutes}m" if hours or minutes else ""
    return out + f"{secs}s"


@dataclass
class _Bucket:
    tokens: float
    at: float


class EventLog:
    def __init__(
        self,
        now: Callable[[], float],
        when: Callable[[float], dt.datetime],
        *,
        store: Store,
        ttl_s: float = 3600.0,
    ) -> None:
        self._now, self._when = now, when
        self.store = store
        self.ttl_s = ttl_s
        self.counts: Counter[str] = Counter()
        self.dropped = 0
        self._by_key: dict[tuple[Any, ...], str] = {}  # dedupe key -> event name
        self._similar: dict[tuple[Any, ...], tuple[float, set[str]]] = {}
        self._spam: dict[tuple[Any, ...], _Bucket] = {}
        self._expires: dict[tuple[str, str], float] = {}  # the current deadline of each
        self._deadlines: list[tuple[float, str, str]] = []  # heap; may hold stale entries
        self._seq = 0

    # --- recording ----------------------------------------------------------------------
    def add(
        self,
        reason: str,
        obj: dict[str, Any],
        message: str,
        *,
        type: str = "Normal",
        node: str | None = None,
        component: str = KUBELET,
        field_path: str | None = None,
    ) -> None:
        self.expire()
        self.counts[reason] += 1
        meta = obj.get("metadata", {})
        involved = {
            "kind": obj.get("kind", ""),
            "namespace": meta.get("namespace", ""),
            "name": meta.get("name", ""),
            "uid": meta.get("uid", ""),
            "apiVersion": obj.get("apiVersion", "v1"),
            "resourceVersion": meta.get("resourceVersion", ""),
        }
        if field_path:
            involved["fieldPath"] = field_path
        obj_key = (involved["kind"], involved["namespace"], involved["name"], involved["uid"])
        source = (component, node or "")
        if not self._allow((*source, *obj_key)):
            self.dropped += 1
            return
        similar = (*source, *obj_key, field_path, type, reason)
        combined = self._aggregate(similar, message)
        if combined:  # one Event for all similar ones, carrying the latest message
            message = COMBINED + message
        key = (*similar, None if combined else message)
        ns = involved["namespace"] or "default"
        name = self._by_key.get(key)
        if name is not None and self.store.get("events", ns, name) is not None:
            self.store.update("events", ns, name, lambda e: self._repeat(e, message))
        else:
            name = self._create(ns, involved, reason, message, type, component, node)
            self._by_key[key] = name
        at = self._now() + self.ttl_s
        self._expires[(ns, name)] = at
        heapq.heappush(self._deadlines, (at, ns, name))

    def _allow(self, key: tuple[Any, ...]) -> bool:
        """client-go's spam filter: a token bucket per source and involved object."""
        now = self._now()
        bucket = self._spam.setdefault(key, _Bucket(_SPAM_BURST, now))
        bucket.tokens = min(_SPAM_BURST, bucket.tokens + (now - bucket.at) / _SPAM_REFILL_S)
        bucket.at = now
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def _aggregate(self, key: tuple[Any, ...], message: str) -> bool:
        """client-go's EventAggregator: from the 10th similar message within 10 minutes on,
        similar events combine into one (keyed without the message)."""
        now = self._now()
        first, seen = self._similar.get(key, (now, set()))
        if now - first > _SIMILAR_WINDOW_S:
            first, seen = now, set()
        seen.add(message)
        self._similar[key] = (first, seen)
        return len(seen) >= _SIMILAR_MAX

    def _create(
        self,
        ns: str,
        involved: dict[str, Any],
        reason: str,
        message: str,
        type: str,
        component: str,
        node: str | None,
    ) -> str:
        when = self._when(self._now())
        self._seq += 1
        # The recorder names an Event "<object>.<unix nanos in hex>"; _seq keeps them unique.
        nanos = int(when.timestamp() * 1e9) + self._seq
        body: Obj = {
            "metadata": {"name": f"{involved['name']}.{nanos:x}", "namespace": ns},
            "involvedObject": involved,
            "reason": reason,
            "message": message,
            "type": type,
            "reportingComponent": component,
            "reportingInstance": node or f"{component}-standin",
        }
        if component == SCHEDULER:  # events.k8s.io/v1 seen through core/v1
            body.update(
                eventTime=rfc3339(when, precise=True),
                action="Binding" if reason == "Scheduled" else "Scheduling",
                source={},
                firstTimestamp=None,
                lastTimestamp=None,
            )
        else:
            stamp = rfc3339(when)
            body.update(
                source={"component": component, **({"host": node} if node else {})},
                firstTimestamp=stamp,
                lastTimestamp=stamp,
                count=1,
                eventTime=None,
            )
        return str(self.store.create("events", ns, body)["metadata"]["name"])

    def _repeat(self, event: Obj, message: str) -> None:
        when = self._when(self._now())
        event["message"] = message
        if event.get("eventTime"):  # events.k8s.io/v1: repeats go into the series
            series = event.get("series") or {"count": 1}
            event["series"] = {
                "count": int(series["count"]) + 1,
                "lastObservedTime": rfc3339(when, precise=True),
            }
        else:
            event["count"] = int(event.get("count") or 1) + 1
            event["lastTimestamp"] = rfc3339(when)

    # --- TTL and reads ------------------------------------------------------------------
    def expire(self) -> int:
        """Delete every Event whose TTL (from its last write) has passed; returns how many.

        Runs before every write and read, so it must not scan every Event: the deadlines sit
        in a heap (the API server leaves this to etcd leases, never a scan); an entry a
        later write pushed back is stale and skipped."""
        now = self._now()
        deleted = 0
        while self._deadlines and self._deadlines[0][0] <= now:
            at, ns, name = heapq.heappop(self._deadlines)
            if self._expires.get((ns, name)) != at:
                continue  # rewritten since: its newer deadline is in the heap too
            del self._expires[(ns, name)]
            deleted += 1
            if self.store.get("events", ns, name) is not None:
                self.store.delete("events", ns, name)
        return deleted

    def list(self) -> list[dict[str, Any]]:
        self.expire()
        items, _ = self.store.list("events", None)
        return items
