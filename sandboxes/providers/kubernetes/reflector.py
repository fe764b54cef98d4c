"""Kubernetes backend: the one list+watch machinery (client-go's reflector) for every
informer -- Sandman's pods and the namespace's pod Events alike.

:class:`Reflector` lists (in pages, ``paging.py``), then watches from the list's
``resourceVersion``. Rules a reader must not break (Kubernetes API Concepts, "Efficient
detection of changes"):
* a watch that ends (its ``timeoutSeconds`` expired), breaks, or is shed with 429 (after its
  ``Retry-After``) is watched again from the LAST version it delivered (bookmarks included):
  one reconnect per expiry, never a list;
* only a 410 Gone (that version compacted away) lists again; a failed list is listed again
  after a backoff;
* it runs in its own thread (the watch blocks) and hands every change to the owning event
  loop: its callbacks run only on that loop, in the order the stream delivered them (the
  list's ``on_sync`` included). What arrives while the loop has not yet taken the last
  hand-off joins it: one ``call_soon_threadsafe`` (one loop wake-up) per batch of changes,
  not per change -- under a burst the wake-ups cost more than the callbacks;
* items stay raw JSON (building a client model per event costs ~15x the parse), decoded
  by orjson when installed (``fastjson.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from sandboxes.providers.kubernetes.config import TRANSPORT_ERRORS, KubernetesConfig, describe
from sandboxes.providers.kubernetes.fastjson import loads
from sandboxes.providers.kubernetes.paging import ListCall, Pages, checked
from sandboxes.providers.kubernetes.retry import RetryPolicy

log = logging.getLogger(__name__)
Item = dict[str, Any]
OnSync = Callable[[list[Item], float, str], None]  # items, monotonic list start, version
OnEvent = Callable[[str, Item], None]  # ADDED / MODIFIED / DELETED, the object


class Reflector:
    """One list+watch of one ``ListCall``; 410 -> list again; anything else -> re-watch."""

    def __init__(
        self,
        call: ListCall,
        config: KubernetesConfig,
        loop: asyncio.AbstractEventLoop,
        on_sync: OnSync,
        on_event: OnEvent,
        *,
        name: str,
    ) -> None:
        self._call, self._config, self._loop = call, config, loop
        self._on_sync, self._on_event = on_sync, on_event
        self.name = name
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name=f"sandman-{name}", daemon=True)
        self._handoff: list[tuple[Callable[..., None], tuple[Any, ...]]] = []
        self._handoff_lock = threading.Lock()
        self._handoff_posted = False  # a _deliver is scheduled on the loop
        self._retry = RetryPolicy(config, lambda n: 0.0)
        self.pages = Pages(call, config, self._retry, self._stop.wait)
        self._version: str | None = None  # None: list (again) before the next watch
        self.lists = 0
        self.watches = 0
        self.relists_after_gone = 0
        self.retry_after_waits: list[float] = []  # each 429's honoured Retry-After

    def start(self) -> None:
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

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
        with self._handoff_lock:
            self._handoff.append((fn, args))
            if self._handoff_posted:
                return  # the scheduled _deliver takes this one too
            self._handoff_posted = True
        try:
            self._loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stop.set()

    def _deliver(self) -> None:
        """On the loop: run every change handed off so far, in order."""
        with self._handoff_lock:
            taken, self._handoff = self._handoff, []
            self._handoff_posted = False
        for fn, args in taken:
            try:
                fn(*args)
            except Exception:  # one bad callback must not drop the changes after it
                log.exception("%s: callback %s failed", self.name, fn)

    def _run(self) -> None:
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
                log.warning("%s: %s; again in %.1f s", self.name, describe(exc), delay)
            except (*TRANSPORT_ERRORS, ValueError) as exc:
                if self._stop.is_set():
                    break
                failures += 1
                delay = self._retry.watch_delay(exc, failures)
                log.warning("%s: %s; again in %.1f s", self.name, describe(exc), delay)
            self._stop.wait(delay)

    def _list(self) -> None:
        started = time.monotonic()
        items, version = self.pages.list_all()
        self.lists += 1
        self._version = version
        self._post(self._on_sync, items, started, version)

    def _watch_once(self, version: str) -> None:
        """One watch stream from ``version``; ``_version`` follows every event delivered."""
        cfg = self._config
        self.watches += 1
        resp: Any = self._call(
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=cfg.watch_timeout_s,
            watch=True,
            _request_timeout=float(cfg.watch_timeout_s + 30),
        )
        self._resp = resp
        try:
            checked(resp)
            for line in watch.watch.iter_resp_lines(resp):
                if not line.strip():
                    continue
                event = loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message", ""))
                meta = obj.get("metadata") or {}
                self._version = meta.get("resourceVersion") or self._version
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._post(self._on_event, kind, obj)
                if self._stop.is_set():
                    break
        finally:
            self._resp = None
            resp.release_conn()
