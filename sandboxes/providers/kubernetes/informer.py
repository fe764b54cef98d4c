"""Kubernetes backend: readiness facts from raw pod JSON and the pod informer.

Readiness comes from ONE list+watch of Sandman's pods in the namespace (an informer-style
cache), never from one poll loop per pod. :class:`PodInformer` lists (in pages,
``paging.py``), then watches from the list's ``resourceVersion``; a watch that ends, breaks
or is answered 429 (after its ``Retry-After``) is watched again from the last version it
delivered, and only a 410 (history compacted) lists again. It runs in its own thread
(the watch blocks) and hands every change to the owning event loop with
``call_soon_threadsafe``: its callbacks run only on that loop.

Events stay raw JSON (building a client model per event costs ~15x the parse). The address
in :func:`ready_info` is ``podIP:port`` -- never a Service -- with the configured execd
port, the one the pod's container port and readiness probe name.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from sandboxes import labels as L
from sandboxes.providers.base import ReadyInfo
from sandboxes.providers.kubernetes.config import (
    SELECTOR,
    TRANSPORT_ERRORS,
    KubernetesConfig,
    describe,
)
from sandboxes.providers.kubernetes.paging import PodPages, checked
from sandboxes.providers.kubernetes.retry import RetryPolicy

log = logging.getLogger(__name__)

# --- readiness facts from a pod (raw JSON: the informer never builds models) ---------------
Pod = dict[str, Any]


def _parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def pod_meta(pod: Pod) -> dict[str, Any]:
    return pod.get("metadata") or {}


def pod_status(pod: Pod) -> dict[str, Any]:
    return pod.get("status") or {}


def _condition_time(pod: Pod, ctype: str) -> dt.datetime | None:
    for cond in pod_status(pod).get("conditions") or []:
        if cond.get("type") == ctype and cond.get("status") == "True":
            return _parse_time(cond.get("lastTransitionTime"))
    return None


def pod_is_ready(pod: Pod) -> bool:
    return bool(pod_status(pod).get("podIP")) and _condition_time(pod, "Ready") is not None


def pod_failure(pod: Pod) -> str | None:
    """Why this pod can never become Ready, or None."""
    if pod_meta(pod).get("deletionTimestamp"):
        return "terminating"
    phase = pod_status(pod).get("phase")
    if phase in ("Failed", "Succeeded"):
        message = (pod_status(pod).get("message") or "").strip()
        return f"phase {phase}: {message}" if message else f"phase {phase}"
    return None


def _guards(pod: Pod) -> dict[str, object]:
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or [{}]
    main = next((c for c in containers if c.get("name") == "sandbox"), containers[0])
    sc = main.get("securityContext") or {}
    return {
        "seccomp": ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type"),
        "capabilities_dropped": list((sc.get("capabilities") or {}).get("drop") or []),
        "no_privilege_escalation": sc.get("allowPrivilegeEscalation") is False,
        "service_account_token": bool(spec.get("automountServiceAccountToken")),
        "egress": (pod_meta(pod).get("labels") or {}).get(L.EGRESS, ""),
    }


def ready_info(pod: Pod, config: KubernetesConfig) -> ReadyInfo:
    """What a Ready pod itself tells: podIP:port, node, guards and the times in its status
    (whole seconds). Pulls, address failures and the finer timeline come from core/v1
    Events (``events.EventFacts.join``); here they are unknown (None)."""
    ip = pod_status(pod).get("podIP") or ""
    port = config.execd_port
    started = None
    for cs in pod_status(pod).get("containerStatuses") or []:
        if cs.get("name") == "sandbox":
            started = _parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
    candidates = {
        "api_created": _parse_time(pod_meta(pod).get("creationTimestamp")),
        "scheduled": _condition_time(pod, "PodScheduled"),
        "started": started,
        "ready": _condition_time(pod, "Ready"),
    }
    return ReadyInfo(
        address=f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}",
        node=(pod.get("spec") or {}).get("nodeName") or "",
        guards=_guards(pod),
        timeline={k: v for k, v in candidates.items() if v is not None},
        image_present=None,
        pull_ms=None,
        address_failures=None,
    )


# --- the informer: one list+watch, run in its own thread ---------------------------------
class PodInformer:
    """Lists Sandman's pods, then watches from the last version seen; 410 -> list again.

    Runs in a dedicated thread (the watch blocks) and hands every change to the owning
    event loop with ``call_soon_threadsafe``; the callbacks run only on that loop. Events
    stay raw JSON: building a client model per event costs ~15x the parse.
    """

    def __init__(
        self,
        core: client.CoreV1Api,
        config: KubernetesConfig,
        loop: asyncio.AbstractEventLoop,
        on_sync: Callable[[list[Pod], float, str], None],
        on_event: Callable[[str, Pod], None],
    ) -> None:
        self._core, self._config, self._loop = core, config, loop
        self._on_sync, self._on_event = on_sync, on_event
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name="sandman-pod-informer", daemon=True)
        self._retry = RetryPolicy(config, lambda n: 0.0)
        self._pages = PodPages(core, config, self._retry, self._stop.wait)
        self._version: str | None = None  # None: list (again) before the next watch
        self.lists = 0
        self.watches = 0
        self.relists_after_gone = 0
        self.retry_after_waits: list[float] = []  # each 429's honoured Retry-After

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        # Shutting the stream's socket down makes the blocked read return at once; repeat:
        # a watch whose response headers were still on their way has no socket yet.
        while self._thread.is_alive() and time.monotonic() < deadline:
            self._interrupt()
            self._thread.join(timeout=0.05)

    def _interrupt(self) -> None:
        resp = self._resp
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stop.set()

    def _run(self) -> None:
        """List once, then watch from the last version seen, for as long as we run.

        As client-go's reflector: a watch that ends, breaks or is shed (429) is re-watched
        from the last resourceVersion it delivered; only a 410 (that version compacted
        away) lists again. A failed list is listed again after a backoff.
        """
        failures = 0
        while not self._stop.is_set():
            try:
                if self._version is None:
                    self._list()
                self._watch_once(self._version or "")
                failures = 0
                continue
            except ApiException as exc:
                if exc.status == 410:
                    self.relists_after_gone += 1
                    self._version = None
                    continue
                failures += 1
                delay = self._retry.watch_delay(exc, failures)
                if exc.status == 429:
                    self.retry_after_waits.append(delay)
                log.warning("pod informer: %s; again in %.1f s", describe(exc), delay)
            except (*TRANSPORT_ERRORS, ValueError) as exc:
                if self._stop.is_set():
                    break
                failures += 1
                delay = self._retry.watch_delay(exc, failures)
                log.warning("pod informer: %s; again in %.1f s", describe(exc), delay)
            self._stop.wait(delay)

    def _list(self) -> None:
        started = time.monotonic()
        items, version = self._pages.list_all()
        self.lists += 1
        self._version = version
        self._post(self._on_sync, items, started, version)

    def _watch_once(self, version: str) -> None:
        """One watch stream from ``version``; ``_version`` follows every event delivered."""
        cfg = self._config
        self.watches += 1
        # With _preload_content=False the answer is urllib3's response, not a V1PodList.
        resp: Any = self._core.list_namespaced_pod(
            cfg.namespace,
            label_selector=SELECTOR,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=cfg.watch_timeout_s,
            watch=True,
            _preload_content=False,
            _request_timeout=float(cfg.watch_timeout_s + 30),
        )
        self._resp = resp
        try:
            checked(resp)
            for line in watch.watch.iter_resp_lines(resp):
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message", ""))
                self._version = pod_meta(obj).get("resourceVersion") or self._version
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._post(self._on_event, kind, obj)
                if self._stop.is_set():
                    break
        finally:
            self._resp = None
            resp.release_conn()
