"""Kubernetes backend, part 5: readiness from the informer's cache, execd health.

Rules a reader must not break:
* ``wait_ready`` never polls the API: a waiter is resolved by the informer's callbacks
  (which run on the provider's loop) -- Ready, failed, replaced by another uid, or
  deleted. A pod deleted before the informer ever listed it fails at once too: a list
  newer than our create that lacks the pod proves it gone (``_missed``).
* The readiness budget is measured with the provider's injected ``sleep`` (tests use a
  fake clock), the execd health probe after Ready with the loop's own time.
* ``work_item_hook(op, name)``, when set, is also called (in a thread) before every execd
  health probe with ``op == "health"``, so a test gate can hold the probe itself.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp

from sandboxes.providers.base import Handle, ReadyInfo
from sandboxes.providers.kubernetes.informer import (
    Pod,
    _meta,
    _status,
    pod_failure,
    pod_is_ready,
    ready_info,
)
from sandman_site.errors import SandboxNotReady

T = TypeVar("T")


@dataclass
class Waiter:
    name: str
    uid: str
    future: asyncio.Future[dict[str, Any]] = field(repr=False)


class ReadinessMixin:
    """Informer callbacks, ``wait_ready`` and ``health`` of :class:`KubernetesProvider`."""

    # --- informer callbacks (loop thread) ---------------------------------------------------
    def _on_sync(self, pods: list[Pod], started: float, version: str) -> None:
        self._listed = (started, version)
        fresh = {_meta(p)["name"]: p for p in pods}
        for name in set(self._cache) - set(fresh):
            self._gone(name, _meta(self._cache[name]).get("uid", ""))
        self._cache = fresh
        for name in set(fresh) | set(self._waiters):
            self._evaluate(name)

    def _missed(self, name: str, uid: str) -> bool:
        """True if ``name`` (stored by us as ``uid``) must have been in the last list.

        A list that started after our create was answered, or whose version is not older
        than the create's, contains the pod unless it was deleted: absent means gone, even
        though no watch ever showed it (deleted before the informer's first list).
        """
        stored = self._stored.get(name)
        if stored is None or (uid and stored[0] != uid) or self._listed is None:
            return False
        list_started, list_version = self._listed
        if stored[1] < list_started:
            return True
        try:
            return int(list_version) >= int(stored[2])
        except ValueError:  # versions are opaque on some servers: no conclusion
            return False

    def _on_event(self, kind: str, pod: Pod) -> None:
        name, uid = _meta(pod).get("name", ""), _meta(pod).get("uid", "")
        if kind == "DELETED":
            cached = self._cache.get(name)
            if cached is not None and _meta(cached).get("uid") == uid:
                del self._cache[name]
            self._gone(name, uid)
            return
        self._cache[name] = pod
        self._evaluate(name)

    def _gone(self, name: str, uid: str) -> None:
        self._deleted[uid] = None
        if name in self._stored and self._stored[name][0] in ("", uid):
            del self._stored[name]
        while len(self._deleted) > 10_000:
            self._deleted.popitem(last=False)
        for waiter in self._waiters.get(name, []):
            if not waiter.future.done() and waiter.uid in ("", uid):
                waiter.future.set_exception(
                    SandboxNotReady(
                        f"pod {name} was deleted before it was Ready",
                        {"name": name, "uid": uid, "reason": "deleted"},
                    )
                )

    def _evaluate(self, name: str) -> None:
        pod = self._cache.get(name)
        if pod is None:
            for waiter in self._waiters.get(name, []):
                gone = waiter.uid in self._deleted or self._missed(name, waiter.uid)
                if gone and not waiter.future.done():
                    waiter.future.set_exception(
                        SandboxNotReady(
                            f"pod {name} was deleted before it was Ready",
                            {"name": name, "uid": waiter.uid, "reason": "deleted"},
                        )
                    )
            return
        for waiter in self._waiters.get(name, []):
            if waiter.future.done():
                continue
            uid = _meta(pod).get("uid", "")
            extra = {"name": name, "uid": uid, "phase": _status(pod).get("phase")}
            failure = pod_failure(pod)
            if waiter.uid and uid != waiter.uid:
                waiter.future.set_exception(
                    SandboxNotReady(
                        f"pod {name} was replaced by another pod", {**extra, "reason": "replaced"}
                    )
                )
            elif failure is not None:
                waiter.future.set_exception(
                    SandboxNotReady(
                        f"pod {name} cannot become Ready: {failure}", {**extra, "reason": failure}
                    )
                )
            elif pod_is_ready(pod):
                waiter.future.set_result(pod)

    # --- readiness, health, listing ----------------------------------------------------------
    async def wait_ready(self, handle: Handle, budget_s: float) -> ReadyInfo:
        loop = self._ensure_started()
        deadline = loop.time() + budget_s
        waiter = Waiter(handle.name, handle.uid, loop.create_future())
        self._waiters.setdefault(handle.name, []).append(waiter)
        self._evaluate(handle.name)
        try:
            pod = await self._within(waiter.future, budget_s)
        except TimeoutError as exc:
            cached = self._cache.get(handle.name)
            phase = _status(cached).get("phase") if cached is not None else None
            raise SandboxNotReady(
                f"pod {handle.name} not Ready within {budget_s:g}s",
                {"name": handle.name, "uid": handle.uid, "phase": phase, "reason": "budget"},
            ) from exc
        finally:
            waiters = self._waiters.get(handle.name, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(handle.name, None)
        info = ready_info(pod, self.config)
        while self.config.verify_health and not await self.health(handle, info.address, ""):
            if loop.time() >= deadline:
                raise SandboxNotReady(
                    f"execd of pod {handle.name} did not answer at {info.address}",
                    {
                        "name": handle.name,
                        "uid": handle.uid,
                        "address": info.address,
                        "reason": "health",
                    },
                )
            await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))
        return info

    async def _within(self, future: asyncio.Future[T], budget_s: float) -> T:
        """``future``'s result, or ``TimeoutError`` once ``budget_s`` has passed on the
        injected ``sleep``; like ``asyncio.wait_for`` (which it is, with the real sleep)."""
        if self._sleep is asyncio.sleep:
            return await asyncio.wait_for(future, budget_s)
        timer = asyncio.ensure_future(self._sleep(budget_s))
        try:
            await asyncio.wait({future, timer}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            future.cancel()
            raise
        finally:
            timer.cancel()
        if future.done():
            return future.result()
        future.cancel()
        raise TimeoutError

    async def health(self, handle: Handle, address: str, token: str) -> bool:
        hook = self.work_item_hook
        if hook is not None:  # a test gate may hold the probe here, before it is sent
            await asyncio.to_thread(hook, "health", handle.name)
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.health_timeout_s)
            )
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with self._http.get(f"http://{address}/health", headers=headers) as resp:
                if resp.status != 200:
                    return False
                body = await resp.json(content_type=None)
                return bool(body.get("ok", True)) if isinstance(body, dict) else True
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return False
