"""Kubernetes backend: the namespace's core/v1 Events, read into per-pod readiness facts.

A cluster tells how a pod got Ready only in Events: the scheduler's ``Scheduled``
(``eventTime``, microseconds), the CNI's ``FailedCreatePodSandBox`` ("failed to assign an
IP address to container"), the kubelet's ``Pulling`` / ``Pulled`` ('Successfully pulled
image "x" in 3.2s (3.2s including waiting). Image size: N bytes.' or 'Container image "x"
already present on machine'), ``Created``, ``Started`` (whole-second ``lastTimestamp``).
:class:`EventInformer` is ONE list+watch of the namespace's pod Events (own thread, 410 ->
list again, like the pod informer); :class:`EventFacts` folds them into :class:`PodFacts`
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
import contextlib
import dataclasses
import datetime as dt
import json
import logging
import re
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from sandboxes.providers.base import ReadyInfo
from sandboxes.providers.kubernetes.config import TRANSPORT_ERRORS, KubernetesConfig, describe

log = logging.getLogger(__name__)

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
    def on_sync(self, events: list[Event]) -> None:
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


def _raw(resp: Any) -> Any:
    status = getattr(resp, "status", 200)
    if not 200 <= status <= 299:
        body = resp.data.decode("utf-8", "replace") if hasattr(resp, "data") else ""
        resp.release_conn()
        raise ApiException(status=status, reason=getattr(resp, "reason", ""), body=body)
    return resp


class EventInformer:
    """Lists the namespace's pod Events, then watches from the list's version; 410 -> list.

    One thread; callbacks posted to ``loop`` with ``call_soon_threadsafe``. Raw JSON only.
    """

    SELECTOR = "involvedObject.kind=Pod"

    def __init__(
        self,
        core: client.CoreV1Api,
        config: KubernetesConfig,
        loop: asyncio.AbstractEventLoop,
        on_sync: Callable[[list[Event]], None],
        on_event: Callable[[str, Event], None],
    ) -> None:
        self._core, self._config, self._loop = core, config, loop
        self._on_sync, self._on_event = on_sync, on_event
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(
            target=self._run, name="sandman-event-informer", daemon=True
        )
        self.lists = 0
        self.watches = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        while self._thread.is_alive() and time.monotonic() < deadline:
            sock = getattr(getattr(self._resp, "connection", None), "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            self._thread.join(timeout=0.05)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stop.set()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._list_then_watch()
                failures = 0
            except ApiException as exc:
                if exc.status == 410:
                    continue
                failures += 1
                log.warning("event informer: %s; listing again", describe(exc))
            except (*TRANSPORT_ERRORS, ValueError) as exc:
                if self._stop.is_set():
                    break
                failures += 1
                log.warning("event informer: %s; listing again", describe(exc))
            cfg = self._config
            delay = min(cfg.backoff_max_s, cfg.backoff_initial_s * 2 ** min(failures, 5))
            self._stop.wait(delay if failures else 0)

    def _list_then_watch(self) -> None:
        cfg = self._config
        resp = _raw(
            self._core.list_namespaced_event(
                cfg.namespace,
                field_selector=self.SELECTOR,
                _request_timeout=cfg.request_timeout_s,
                _preload_content=False,
            )
        )
        listed = json.loads(resp.data)
        self.lists += 1
        version = listed["metadata"]["resourceVersion"]
        self._post(self._on_sync, listed.get("items") or [])
        while not self._stop.is_set():
            version = self._watch_once(version)

    def _watch_once(self, version: str) -> str:
        cfg = self._config
        self.watches += 1
        resp: Any = self._core.list_namespaced_event(
            cfg.namespace,
            field_selector=self.SELECTOR,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=cfg.watch_timeout_s,
            watch=True,
            _preload_content=False,
            _request_timeout=float(cfg.watch_timeout_s + 30),
        )
        self._resp = resp
        try:
            _raw(resp)
            for line in watch.watch.iter_resp_lines(resp):
                if not line.strip():
                    continue
                item = json.loads(line)
                kind, obj = item.get("type"), item.get("object") or {}
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message", ""))
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._post(self._on_event, kind, obj)
                if self._stop.is_set():
                    break
        finally:
            self._resp = None
            resp.release_conn()
        return version
