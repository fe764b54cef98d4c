"""Kubernetes backend: readiness facts from raw pod JSON and the pod informer.

Readiness comes from ONE list+watch of Sandman's pods in the namespace (an informer-style
cache), never from one poll loop per pod. :class:`PodInformer` lists, then watches from the
list's ``resourceVersion``; a 410 (history compacted) lists again. It runs in its own thread
(the watch blocks) and hands every change to the owning event loop with
``call_soon_threadsafe``: its callbacks run only on that loop.

Events stay raw JSON (building a client model per event costs ~15x the parse). The address
in :func:`ready_info` is ``podIP:port`` -- never a Service -- with the port from
``sandman.dev/execd-port`` when a pod carries it (the stand-in's ``--run-execd``).
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
    ann = pod_meta(pod).get("annotations") or {}
    ip = pod_status(pod).get("podIP") or ""
    port = int(ann.get(L.EXECD_PORT_ANNOTATION) or config.execd_port)
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
def _raw(resp: Any) -> Any:
    """Check a ``_preload_content=False`` answer's status like the client would."""
    status = getattr(resp, "status", 200)
    if not 200 <= status <= 299:
        body = resp.data.decode("utf-8", "replace") if hasattr(resp, "data") else ""
        resp.release_conn()
        raise ApiException(status=status, reason=getattr(resp, "reason", ""), body=body)
    return resp


class PodInformer:
    """Lists Sandman's pods, then watches from the list's version; 410 -> list again.

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
        self.lists = 0
        self.watches = 0
        self.relists_after_gone = 0

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
        failures = 0
        while not self._stop.is_set():
            try:
                self._list_then_watch()
                failures = 0
            except ApiException as exc:
                if exc.status == 410:
                    self.relists_after_gone += 1
                    continue
                failures += 1
                log.warning("pod informer: %s; listing again", describe(exc))
            except (*TRANSPORT_ERRORS, ValueError) as exc:
                if self._stop.is_set():
                    break
                failures += 1
                log.warning("pod informer: %s; listing again", describe(exc))
            cfg = self._config
            delay = min(cfg.backoff_max_s, cfg.backoff_initial_s * 2 ** min(failures, 5))
            self._stop.wait(delay if failures else 0)

    def _list_then_watch(self) -> None:
        cfg = self._config
        started = time.monotonic()
        resp = _raw(
            self._core.list_namespaced_pod(
                cfg.namespace,
                label_selector=SELECTOR,
                _request_timeout=cfg.request_timeout_s,
                _preload_content=False,
            )
        )
        listed = json.loads(resp.data)
        self.lists += 1
        version = listed["metadata"]["resourceVersion"]
        self._post(self._on_sync, listed.get("items") or [], started, version)
        while not self._stop.is_set():
            version = self._watch_once(version)

    def _watch_once(self, version: str) -> str:
        """One watch stream from ``version``; returns the last version seen."""
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
            _raw(resp)
            for line in watch.watch.iter_resp_lines(resp):
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message", ""))
                version = pod_meta(obj).get("resourceVersion") or version
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._post(self._on_event, kind, obj)
                if self._stop.is_set():
                    break
        finally:
            self._resp = None
            resp.release_conn()
        return version
