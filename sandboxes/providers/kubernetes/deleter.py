"""Kubernetes backend: the pod deleter, its pending set and the owner's delete hooks.

Rules a reader must not break (paper §4.4, Appendix F, Table 2 row 3):
* ``destroy`` is idempotent: 404 -- or 409 on the UID precondition (the name now holds
  another object) -- means gone. A delete that fails, loses its answer or is cancelled
  enters the pending set (``on_pending``), is retried with backoff 1 s -> 30 s and leaves
  the set only when confirmed (``on_deleted``).
* A 2xx is NOT a confirmation: the pod is Terminating for its grace period (longer on a
  lost node or with finalizers). It enters the pending set marked ``terminating`` and is
  confirmed only when it is gone -- a DELETED event or a relist without it
  (:meth:`PodDeleter.note_gone`, from ``terminating.GoneTracker``) or a 404 read.
  A Terminating pod is never DELETEd again: a retry reads it instead.
* A pending entry known only by name is read back first and deleted only if it carries
  its nonce (or, without a nonce, Sandman's managed-by label): never another tenant's pod.
* Once the provider closes, the retrier stops and nothing starts it again; entries stay
  pending (the owner's table has them through ``on_pending``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandboxes import labels as L
from sandboxes.providers.base import Handle
from sandboxes.providers.kubernetes.calls import ApiCalls, Background
from sandboxes.providers.kubernetes.config import TRANSPORT_ERRORS, KubernetesConfig, describe
from sandman_site.errors import ProviderError

log = logging.getLogger(__name__)

_CONFIRMED_KEPT = 10_000


@dataclass(frozen=True)
class PendingDelete:
    """A pod Sandman owns and must delete; ``uid`` is empty when only the name is known."""

    name: str
    uid: str
    nonce: str
    attempts: int = 0
    last_error: str = ""
    terminating: bool = False  # a DELETE was accepted: only "gone" is awaited now


class Unconfirmed(Exception):
    """A delete whose outcome is unknown or failed: keep the pod pending."""


class DeleteHooks:
    """The owner's callbacks: a delete became pending, a delete was confirmed.

    A broken callback is logged, never raised: the pod stays in the pending set whatever
    the owner's callback does.
    """

    def __init__(
        self,
        on_pending: Callable[[PendingDelete], None] | None = None,
        on_deleted: Callable[[str, str], None] | None = None,
    ) -> None:
        self._on_pending, self._on_deleted = on_pending, on_deleted

    def pending(self, entry: PendingDelete) -> None:
        if self._on_pending is not None:
            self._call(self._on_pending, entry)

    def deleted(self, name: str, uid: str) -> None:
        if self._on_deleted is not None:
            self._call(self._on_deleted, name, uid)

    @staticmethod
    def _call(fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception:  # a broken hook must not lose the pod: it stays in our set
            log.exception("kubernetes provider hook %s failed", fn)


def delete_object(
    core: client.CoreV1Api,
    config: KubernetesConfig,
    name: str,
    uid: str,
    resource: str = "pods",
) -> str:
    """One delete (worker thread) with a UID precondition when ``uid`` is known.

    Returns how it was confirmed (``deleted``, ``gone``, ``replaced``); raises
    :class:`Unconfirmed` otherwise. ``resource`` is ``pods`` or ``configmaps``.
    """
    # The body as plain JSON and the request through the client's own machinery
    # (``param_serialize`` + ``call_api``, what ``delete_namespaced_pod`` does after its
    # pydantic argument check and ``V1DeleteOptions`` serialisation: those cost more CPU
    # than the rest of the call). The raw answer is read only for its status.
    body: dict[str, Any] = {"propagationPolicy": "Background"}
    if uid:
        body["preconditions"] = {"uid": uid}
    api = core.api_client
    try:
        request = api.param_serialize(
            method="DELETE",
            resource_path=f"/api/v1/namespaces/{{namespace}}/{resource}/{{name}}",
            path_params={"namespace": config.namespace, "name": name},
            header_params={"Accept": "application/json", "Content-Type": "application/json"},
            body=body,
            auth_settings=["BearerToken"],
        )
        resp: Any = api.call_api(*request, _request_timeout=config.request_timeout_s)
        try:
            resp.read()  # the whole body, so the connection can be reused
        finally:
            resp.response.release_conn()
        if not 200 <= resp.status <= 299:
            raise ApiException.from_response(http_resp=resp, body=None, data=None)
    except ApiException as exc:
        if exc.status == 404:
            return "gone"
        if exc.status == 409 and uid:
            return "replaced"  # the name now holds someone else's object: ours is gone
        raise Unconfirmed(describe(exc)) from exc
    except TRANSPORT_ERRORS as exc:
        raise Unconfirmed(describe(exc)) from exc
    return "deleted"


class PodDeleter:
    """Deletes pods until confirmed and keeps the ones not yet confirmed pending.

    ``forget_stored(name, uid)`` tells the readiness tracker a pod it saw stored is gone.
    """

    def __init__(
        self,
        core: client.CoreV1Api,
        config: KubernetesConfig,
        *,
        calls: ApiCalls,
        background: Background,
        hooks: DeleteHooks,
        ensure_started: Callable[[], object],
        forget_stored: Callable[[str, str], None],
        sleep: Callable[[float], Awaitable[None]],
        backoff: Callable[[int], float],
        is_terminating: Callable[[str, str], bool],
        was_gone: Callable[[str], bool],
    ) -> None:
        self._core, self._config = core, config
        self._calls, self._background, self._hooks = calls, background, hooks
        self._ensure_started = ensure_started
        self._forget_stored = forget_stored
        self._sleep, self._backoff = sleep, backoff
        self._is_terminating, self._was_gone = is_terminating, was_gone
        self._pending: dict[str, PendingDelete] = {}
        self._gone_waiters: dict[str, list[asyncio.Future[None]]] = {}
        self._confirmed: OrderedDict[str, None] = OrderedDict()  # uids told to on_deleted
        self._retrier: asyncio.Task[None] | None = None
        self._stopped = False

    # --- one delete (worker thread) --------------------------------------------------------
    def delete_sync(self, name: str, uid: str) -> str:
        """One pod delete with a UID precondition: ``deleted`` (accepted: the pod may be
        Terminating), ``gone`` or ``replaced``; raises Unconfirmed otherwise."""
        return delete_object(self._core, self._config, name, uid)

    def _delete_pending_sync(self, entry: PendingDelete, terminating: bool) -> tuple[str, str]:
        """(how, uid): read first when only the name is known or the pod may be Terminating
        (``terminating``) -- a Terminating pod gets no second DELETE."""
        uid = entry.uid
        if not uid or terminating:
            try:
                pod = self._core.read_namespaced_pod(
                    entry.name,
                    self._config.namespace,
                    _request_timeout=self._config.request_timeout_s,
                )
            except ApiException as exc:
                if exc.status == 404:
                    return "gone", uid
                raise Unconfirmed(describe(exc)) from exc
            except TRANSPORT_ERRORS as exc:
                raise Unconfirmed(describe(exc)) from exc
            meta = pod.metadata or client.V1ObjectMeta()
            if uid and meta.uid != uid:
                return "replaced", uid
            nonce = (meta.annotations or {}).get(L.NONCE_ANNOTATION)
            managed = (meta.labels or {}).get(L.MANAGED_BY) == L.VALUE_MANAGED_BY
            # Without a nonce (a handle rebuilt from a listing) our label must be there.
            if not uid and ((nonce != entry.nonce) if entry.nonce else not managed):
                return "not_ours", uid
            uid = meta.uid or ""
            if meta.deletion_timestamp is not None:
                return "terminating", uid
        return self.delete_sync(entry.name, uid), uid

    # --- the pending set (loop thread) -----------------------------------------------------
    def add_pending(self, entry: PendingDelete) -> None:
        """Own ``entry`` until a delete is confirmed; starts the retrier if it is idle."""
        if entry.uid and self._was_gone(entry.uid):
            self._confirm(entry.name, entry.uid)  # its DELETED event came first
            return
        if entry.name not in self._pending:
            self._pending[entry.name] = entry
            self._hooks.pending(entry)
        elif entry.terminating or entry.uid:
            old = self._pending[entry.name]
            self._pending[entry.name] = replace(
                old, uid=old.uid or entry.uid, terminating=old.terminating or entry.terminating
            )
        if self._config.retry_pending_in_background and not self._stopped:
            if self._retrier is None or self._retrier.done():
                self._retrier = self._background.spawn(self._retry_pending())

    def note_gone(self, name: str, uid: str, nonce: str) -> None:
        """The informer saw ``name`` (as ``uid``) go: confirm a pending delete of it."""
        entry = self._pending.get(name)
        if entry is None:
            return
        if entry.uid == uid or (not entry.uid and entry.nonce and entry.nonce == nonce):
            self._confirm(name, uid)

    def _confirm(self, name: str, uid: str) -> None:
        self._pending.pop(name, None)
        self._forget_stored(name, uid)
        for waiter in self._gone_waiters.pop(name, []):
            if not waiter.done():
                waiter.set_result(None)
        if uid and uid in self._confirmed:
            return  # told already (its DELETED event and our answer raced): never twice
        if uid:
            self._confirmed[uid] = None
            while len(self._confirmed) > _CONFIRMED_KEPT:
                self._confirmed.popitem(last=False)
        self._hooks.deleted(name, uid)

    def pending_deletes(self) -> list[PendingDelete]:
        return list(self._pending.values())

    def adopt(self, name: str, uid: str, nonce: str) -> None:
        """Adopt a pending delete recorded elsewhere (the pool's table after a restart)."""
        self._ensure_started()
        self.add_pending(PendingDelete(name, uid, nonce))

    def _known_terminating(self, entry: PendingDelete) -> bool:
        held = self._pending.get(entry.name)
        return self._is_terminating(entry.name, entry.uid) or (
            held is not None and held.terminating and held.uid in ("", entry.uid)
        )

    async def _attempt(self, entry: PendingDelete) -> tuple[str, str]:
        """One try: DELETE, or a read first if the pod is Terminating or an earlier DELETE
        of it went unanswered (it may have been applied: no second DELETE then); (how, uid).
        A pod the watch already saw deleted is gone without any request."""
        if entry.uid and self._was_gone(entry.uid):
            return "gone", entry.uid
        held = self._pending.get(entry.name)
        unanswered = bool(entry.last_error or (held is not None and held.last_error))
        terminating = self._known_terminating(entry) or unanswered
        how, uid = await self._calls.run(
            "delete", entry.name, self._delete_pending_sync, entry, terminating
        )
        return how, uid or entry.uid

    async def destroy(self, handle: Handle) -> None:
        self._ensure_started()
        entry = PendingDelete(handle.name, handle.uid, handle.nonce)
        last = ""
        try:
            for attempt in range(max(1, self._config.destroy_attempts)):
                if attempt:
                    await self._sleep(self._backoff(attempt - 1))
                try:
                    how, uid = await self._attempt(entry)
                except Unconfirmed as exc:
                    last = str(exc)
                    self.add_pending(replace(entry, attempts=attempt + 1, last_error=last))
                    continue
                if how in ("deleted", "terminating"):
                    if await self.await_gone(replace(entry, uid=uid, terminating=True)):
                        return
                    raise ProviderError(
                        f"pod {handle.name} is still Terminating; kept pending",
                        {"name": handle.name, "uid": uid, "pending": True, "terminating": True},
                    )
                self._confirm(handle.name, uid)
                return
        except asyncio.CancelledError:
            self.add_pending(entry)  # the delete may be in flight: keep owning the pod
            raise
        raise ProviderError(
            f"delete of pod {handle.name} not confirmed ({last}); kept pending",
            {"name": handle.name, "uid": handle.uid, "pending": True, "last_error": last},
        )

    async def await_gone(self, entry: PendingDelete) -> bool:
        """The pod is Terminating: own it (pending) and wait for it to be gone; when the
        wait runs out a read settles it. True once confirmed gone, else it stays pending."""
        self.add_pending(entry)
        if entry.name not in self._pending:
            return True  # already gone (its DELETED event came first)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._gone_waiters.setdefault(entry.name, []).append(waiter)
        budget = self._config.delete_confirm_s
        if budget is None:
            budget = self._config.termination_grace_s + self._config.request_timeout_s
        if await self._within(entry.name, waiter, budget):
            return True
        try:
            how, _ = await self._attempt(entry)
        except Unconfirmed:
            return False
        if how in ("gone", "replaced", "not_ours"):
            self._confirm(entry.name, entry.uid)
            return True
        return False

    async def _within(self, name: str, waiter: asyncio.Future[None], budget_s: float) -> bool:
        """True if ``waiter`` resolved within ``budget_s`` on the injected ``sleep``."""
        timer = asyncio.ensure_future(self._sleep(budget_s))
        try:
            if not waiter.done():
                await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
            if not waiter.done():
                waiter.cancel()
            waiters = self._gone_waiters.get(name, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._gone_waiters.pop(name, None)
        return not waiter.cancelled()

    async def flush_pending(self) -> int:
        """Try every pending delete once (a read for a Terminating pod) and wait for the
        accepted ones to be gone; returns how many were confirmed."""
        self._ensure_started()
        confirmed = 0
        terminating: list[PendingDelete] = []
        for entry in list(self._pending.values()):
            if entry.name not in self._pending:
                continue  # confirmed by the informer meanwhile
            try:
                how, uid = await self._attempt(entry)
            except Unconfirmed as exc:
                if entry.name in self._pending:
                    self._pending[entry.name] = replace(
                        entry, attempts=entry.attempts + 1, last_error=str(exc)
                    )
                continue
            if how in ("deleted", "terminating"):
                terminating.append(replace(entry, uid=uid, terminating=True))
                continue
            self._confirm(entry.name, uid)
            confirmed += 1
        gone = await asyncio.gather(*(self.await_gone(e) for e in terminating))
        return confirmed + sum(gone)

    async def _retry_pending(self) -> None:
        attempt = 0
        while self._pending and not self._stopped:
            await self._sleep(self._backoff(attempt))
            attempt = 0 if await self.flush_pending() else attempt + 1

    def stop(self) -> asyncio.Task[None] | None:
        """The provider closes: cancel the retrier (returned) and never start it again."""
        self._stopped = True
        if self._retrier is not None:
            self._retrier.cancel()
        return self._retrier
