"""Kubernetes backend: the readiness tracker -- the informer's cache, waiters, ``wait_ready``.

Rules a reader must not break:
* ``wait_ready`` never polls the API: a waiter is resolved by the informer's callbacks
  (:meth:`ReadinessTracker.on_sync` / :meth:`~ReadinessTracker.on_event`, which run on the
  provider's loop) -- Ready, failed, replaced by another uid, or deleted. A pod deleted
  before the informer ever listed it fails at once too: a list newer than our create that
  lacks the pod proves it gone (``_missed``, fed by :meth:`~ReadinessTracker.note_stored`).
* The readiness budget is measured with the provider's injected ``sleep`` (tests use a
  fake clock), the execd health probe after Ready with the loop's own time.
* Every method runs on the provider's loop: the cache and the waiters have no lock.
* What a Ready pod does not say itself (pulls, address failures, the finer timeline) is
  joined from the namespace's core/v1 Events (``events.EventFacts``); no Event -> unknown.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from sandboxes.providers.base import Handle, LostSandbox, ReadyInfo
from sandboxes.providers.kubernetes.config import KubernetesConfig
from sandboxes.providers.kubernetes.events import EventFacts
from sandboxes.providers.kubernetes.informer import (
    Pod,
    pod_failure,
    pod_is_ready,
    pod_meta,
    pod_status,
    ready_info,
)
from sandboxes.providers.kubernetes.stuck import final_waiting, lost_reason, scheduling_wait
from sandman_site.errors import SandboxNotReady

T = TypeVar("T")

# Recently deleted uids kept so a wait that starts after the DELETED event fails at once.
_DELETED_KEPT = 10_000


@dataclass
class Waiter:
    name: str
    uid: str
    future: asyncio.Future[Pod] = field(repr=False)


class ReadinessTracker:
    """Readiness of Sandman's pods from the informer's events; ``wait_ready`` on top.

    ``ensure_started()`` starts the informer on first use (and raises once closed);
    ``health(name, address, token)`` is one execd health check.
    """

    def __init__(
        self,
        config: KubernetesConfig,
        *,
        ensure_started: Callable[[], asyncio.AbstractEventLoop],
        health: Callable[[str, str, str], Awaitable[bool]],
        sleep: Callable[[float], Awaitable[None]],
        events: EventFacts | None = None,
    ) -> None:
        self._config = config
        self._events = events
        self._ensure_started = ensure_started
        self._health = health
        self._sleep = sleep
        self._cache: dict[str, Pod] = {}
        # Recently deleted uids: a wait_ready that starts after the DELETED event still fails
        # at once instead of waiting out its budget. Bounded, oldest first out.
        self._deleted: OrderedDict[str, None] = OrderedDict()
        # Creates this provider saw stored (name -> uid, when, version) and the last list
        # (when it started, its version): together they tell "deleted before we ever saw it".
        self._stored: dict[str, tuple[str, float, str]] = {}
        self._listed: tuple[float, str] | None = None
        self._waiters: dict[str, list[Waiter]] = {}
        # Pods that were Ready and no longer are, until the owner takes them (bounded).
        self._lost: list[LostSandbox] = []
        self.on_lost: Callable[[], None] | None = None  # told at each new one (loop thread)

    # --- what the creator and the deleter tell us -------------------------------------------
    def note_stored(self, name: str, uid: str, stored_at: float, version: str) -> None:
        """The API confirmed ``name`` stored as ``uid`` at ``stored_at`` (time.monotonic())
        with ``version`` (its resourceVersion in that answer)."""
        self._stored[name] = (uid, stored_at, version)

    def forget_stored(self, name: str, uid: str) -> None:
        """``name`` (as ``uid``, or whatever uid when we never learned one) is gone."""
        if name in self._stored and self._stored[name][0] in ("", uid):
            del self._stored[name]

    # --- informer callbacks (loop thread) ---------------------------------------------------
    def on_sync(self, pods: list[Pod], started: float, version: str) -> None:
        self._listed = (started, version)
        fresh = {pod_meta(p)["name"]: p for p in pods}
        for name, pod in fresh.items():
            self._note_lost(self._cache.get(name), pod)
        for name in set(self._cache) - set(fresh):
            self._gone(name, pod_meta(self._cache[name]).get("uid", ""))
        self._cache = fresh
        for name in set(fresh) | set(self._waiters):
            self._evaluate(name)

    def on_event(self, kind: str, pod: Pod) -> None:
        name, uid = pod_meta(pod).get("name", ""), pod_meta(pod).get("uid", "")
        if kind == "DELETED":
            cached = self._cache.get(name)
            if cached is not None and pod_meta(cached).get("uid") == uid:
                del self._cache[name]
            self._gone(name, uid)
            return
        self._note_lost(self._cache.get(name), pod)
        self._cache[name] = pod
        self._evaluate(name)

    def _note_lost(self, old: Pod | None, new: Pod) -> None:
        """A pod we saw Ready that is now Failed or not Ready: keep it for ``take_lost``."""
        if old is None or pod_meta(old).get("uid") != pod_meta(new).get("uid"):
            return
        if not pod_is_ready(old) or (lost := lost_reason(new)) is None:
            return
        meta = pod_meta(new)
        self._lost.append(LostSandbox(meta.get("name", ""), meta.get("uid", ""), *lost))
        del self._lost[:-_DELETED_KEPT]
        if self.on_lost is not None:
            self.on_lost()

    def lost_now(self, name: str, uid: str) -> LostSandbox | None:
        """The cached pod ``name`` (as ``uid``, if given) is Failed or not Ready now."""
        pod = self._cache.get(name)
        if pod is None or (uid and pod_meta(pod).get("uid") != uid):
            return None
        lost = lost_reason(pod)
        return None if lost is None else LostSandbox(name, pod_meta(pod).get("uid", ""), *lost)

    def take_lost(self) -> list[LostSandbox]:
        """Every pod lost since the last call (each reported once)."""
        lost, self._lost = self._lost, []
        return lost

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

    def _gone(self, name: str, uid: str) -> None:
        self._deleted[uid] = None
        self.forget_stored(name, uid)
        while len(self._deleted) > _DELETED_KEPT:
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
            uid = pod_meta(pod).get("uid", "")
            extra = {"name": name, "uid": uid, "phase": pod_status(pod).get("phase")}
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
            elif (stuck := final_waiting(pod)) is not None:
                where = "init container" if stuck.init else "container"
                waiter.future.set_exception(
                    SandboxNotReady(
                        f"pod {name} cannot become Ready: {stuck.reason} in {where}"
                        f" {stuck.container}: {stuck.message}",
                        {
                            **extra,
                            "reason": stuck.reason,
                            "container": stuck.container,
                            "init": stuck.init,
                            "message": stuck.message,
                        },
                    )
                )
            elif pod_is_ready(pod):
                waiter.future.set_result(pod)

    # --- readiness ---------------------------------------------------------------------------
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
            phase = pod_status(cached).get("phase") if cached is not None else None
            waiting = scheduling_wait(cached)  # wait-and-see reasons: say which one it was
            why = f": {waiting[0]}: {waiting[1]}" if waiting else ""
            raise SandboxNotReady(
                f"pod {handle.name} not Ready within {budget_s:g}s{why}",
                {
                    "name": handle.name,
                    "uid": handle.uid,
                    "phase": phase,
                    "reason": "budget",
                    "waiting_on": waiting[0] if waiting else None,
                },
            ) from exc
        finally:
            waiters = self._waiters.get(handle.name, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(handle.name, None)
        info = ready_info(pod, self._config)
        if self._events is not None:
            uid = pod_meta(pod).get("uid", "")
            await self._events.settled(uid, self._config.events_grace_s)
            info = self._events.join(info, uid)
        while self._config.verify_health and not await self._health(handle.name, info.address, ""):
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
        timer: asyncio.Future[None] = asyncio.ensure_future(self._sleep(budget_s))
        racers: set[asyncio.Future[Any]] = {future, timer}
        try:
            await asyncio.wait(racers, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            future.cancel()
            raise
        finally:
            timer.cancel()
        if future.done():
            return future.result()
        future.cancel()
        raise TimeoutError

    def close(self) -> None:
        """The provider closed: every waiter still waiting fails now."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(
                        SandboxNotReady("the provider closed", {"name": waiter.name})
                    )
