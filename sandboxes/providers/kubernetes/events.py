"""Kubernetes backend: the namespace's core/v1 Events, read into per-pod readiness facts.

A cluster tells how a pod got Ready only in Events: the scheduler's ``Scheduled``
(``eventTime``, microseconds), the CNI's ``FailedCreatePodSandBox`` ("failed to assign an
IP address to container"), the kubelet's ``Pulling`` / ``Pulled`` ('Successfully pulled
image "x" in 3.2s (3.2s including waiting). Image size: N bytes.' or 'Container image "x"
already present on machine'), ``Created``, ``Started`` (whole-second ``lastTimestamp``).
:func:`event_informer` is ONE list+watch of the namespace's pod Events on the pod informer's
machinery (``reflector.py``: paged list, resume from the last version, 410 -> list again);
:class:`EventFacts` folds them into :class:`PodFacts`
keyed by pod uid, and :meth:`EventFacts.join` puts them into a ``ReadyInfo``.

Rules a reader must not break:
* Events are aggregated (a repeat bumps ``count`` / ``series.count`` on the same object, and
  similar ones combine), rate-limited and expire (kube-apiserver ``--event-ttl``, 1 h by
  default): so a count is the latest ``count`` of each distinct Event summed, and a fact
  with no Event is ``None`` (unknown) -- never 0 or False. Address failures are a number
  only when the pod's ``Scheduled`` Event was seen (the stream covered its whole start).
* Only the task container's (``spec.containers{sandbox}``) pulls count as the image pull.
* Every :class:`EventFacts` method runs on the provider's loop (the informer posts to it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client

from sandboxes.providers.base import ReadyInfo
from sandboxes.providers.kubernetes.config import KubernetesConfig
from sandboxes.providers.kubernetes.paging import ListCall
from sandboxes.providers.kubernetes.reflector import OnEvent, OnSync, Reflector

Event = dict[str, Any]
MAIN_PATH = "spec.containers{sandbox}"
TIMELINE = ("api_created", "scheduled", "address_assigned", "image_pulled", "started", "ready")
_KEPT = 20_000  # pods whose facts are kept, oldest first out
_PULLED = re.compile(r'^Successfully pulled image ".*" in (\S+)(?: \((\S+) including waiting\))?')
_PRESENT = re.compile(r'^Container image ".*" already present on machine')
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|us|µs|ns|h|m|s)")


def go_duration_s(text: str) -> float | None:
    """Seconds in a Go ``time.Duration`` string (``1m4.2s``, ``512ms``), or None."""
    parts = _PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(n) * _UNIT_S[u] for n, u in parts)


def _time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def event_time(event: Event) -> dt.datetime | None:
    """When it (last) happened: ``series.lastObservedTime`` / ``eventTime`` (events.k8s.io)
    or ``lastTimestamp`` / ``firstTimestamp`` (the kubelet's core/v1 recorder)."""
    series = event.get("series") or {}
    return (
        _time(series.get("lastObservedTime"))
        or _time(event.get("eventTime"))
        or _time(event.get("lastTimestamp"))
        or _time(event.get("firstTimestamp"))
    )


def _first_time(event: Event) -> dt.datetime | None:
    return _time(event.get("eventTime")) or _time(event.get("firstTimestamp"))


def event_count(event: Event) -> int:
    series = event.get("series") or {}
    return int(series.get("count") or event.get("count") or 1)


@dataclass
class PodFacts:
    """What the Events told about one pod; ``None`` = no Event said so."""

    scheduled: dt.datetime | None = None
    address_failures: dict[str, int] = field(default_factory=dict)  # Event name -> count
    sandbox_ready: dt.datetime | None = None  # first container Event: the sandbox has its IP
    image_pulled: dt.datetime | None = None
    image_present: bool | None = None
    pull_ms: float | None = None
    started: dt.datetime | None = None

    def apply(self, event: Event) -> None:
        reason, message = event.get("reason") or "", event.get("message") or ""
        path = (event.get("involvedObject") or {}).get("fieldPath") or ""
        when = event_time(event)
        if reason == "Scheduled":
            self.scheduled = _first_time(event) or when
        elif reason == "FailedCreatePodSandBox" and "failed to assign an IP address" in message:
            name = (event.get("metadata") or {}).get("name", "")
            self.address_failures[name] = max(
                self.address_failures.get(name, 0), event_count(event)
            )
        if reason in ("Pulling", "Pulled", "Created", "Started") and path:
            first = _first_time(event) or when
            if first is not None and (self.sandbox_ready is None or first < self.sandbox_ready):
                self.sandbox_ready = first
        if path != MAIN_PATH:
            return
        if reason == "Pulled":
            self._pulled(message, when)
        elif reason == "Started":
            self.started = _first_time(event) or when

    def _pulled(self, message: str, when: dt.datetime | None) -> None:
        if _PRESENT.match(message):
            self.image_present, self.pull_ms, self.image_pulled = True, 0.0, when
            return
        m = _PULLED.match(message)
        if m is None:
            return
        took = go_duration_s(m.group(2) or m.group(1))  # including waiting: what we waited
        self.image_present, self.image_pulled = False, when
        self.pull_ms = None if took is None else took * 1000.0


class EventFacts:
    """Per-pod facts from the Events informer's callbacks; ``settled`` waits for them."""

    def __init__(self) -> None:
        self._facts: OrderedDict[str, PodFacts] = OrderedDict()
        self._started: dict[str, list[asyncio.Future[None]]] = {}

    def facts(self, uid: str) -> PodFacts | None:
        return self._facts.get(uid)

    # --- informer callbacks (loop thread) ----------------------------------------------------
    def on_sync(self, events: list[Event], started: float = 0.0, version: str = "") -> None:
        for event in events:
            self.on_event("ADDED", event)

    def on_event(self, kind: str, event: Event) -> None:
        if kind not in ("ADDED", "MODIFIED"):  # DELETED: expired; what it said still holds
            return
        involved = event.get("involvedObject") or {}
        uid = involved.get("uid") or ""
        if not uid or involved.get("kind") != "Pod":
            return
        facts = self._facts.get(uid)
        if facts is None:
            facts = self._facts[uid] = PodFacts()
            while len(self._facts) > _KEPT:
                self._facts.popitem(last=False)
        self._facts.move_to_end(uid)
        facts.apply(event)
        if facts.started is not None:
            for fut in self._started.pop(uid, []):
                if not fut.done():
                    fut.set_result(None)

    # --- readiness --------------------------------------------------------------------------
    async def settled(self, uid: str, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the task container's ``Started`` Event is in:
        Events travel on their own stream and may trail the pod's Ready status."""
        facts = self._facts.get(uid)
        if facts is not None and facts.started is not None:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._started.setdefault(uid, []).append(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            waiting = self._started.get(uid, [])
            if fut in waiting:
                waiting.remove(fut)
            if not waiting:
                self._started.pop(uid, None)

    def join(self, info: ReadyInfo, uid: str) -> ReadyInfo:
        """``info`` (from the pod) with what the Events add; unknown stays ``None``."""
        facts = self._facts.get(uid)
        if facts is None:
            return dataclasses.replace(info, address_failures=None)
        stages: dict[str, dt.datetime | None] = dict(info.timeline)
        stages["scheduled"] = facts.scheduled or stages.get("scheduled")
        stages["address_assigned"] = facts.sandbox_ready
        stages["image_pulled"] = facts.image_pulled
        stages["started"] = stages.get("started") or facts.started
        timeline: dict[str, dt.datetime] = {}
        floor: dt.datetime | None = None
        for name in TIMELINE:
            at = stages.get(name)
            if at is None:
                continue
            # Whole-second kubelet stamps can floor below the scheduler's precise eventTime:
            # a later stage never happened before an earlier one.
            floor = at if floor is None or at > floor else floor
            timeline[name] = floor
        failures = sum(facts.address_failures.values()) if facts.scheduled else None
        return dataclasses.replace(
            info,
            timeline=timeline,
            image_present=facts.image_present,
            pull_ms=facts.pull_ms,
            address_failures=failures,
        )


def event_list_call(core: client.CoreV1Api, config: KubernetesConfig) -> ListCall:
    """The namespace's Events about pods (a field selector: Events carry no labels)."""

    def call(**kwargs: Any) -> Any:
        return core.list_namespaced_event(
            config.namespace,
            field_selector="involvedObject.kind=Pod",
            _preload_content=False,
            **kwargs,
        )

    return call


def event_informer(
    core: client.CoreV1Api,
    config: KubernetesConfig,
    loop: asyncio.AbstractEventLoop,
    on_sync: OnSync,
    on_event: OnEvent,
) -> Reflector:
    """The one list+watch of the namespace's pod Events (not started): the pod informer's
    machinery -- paged list, resume from the last version, relist only on 410."""
    return Reflector(
        event_list_call(core, config), config, loop, on_sync, on_event, name="event-informer"
    )
