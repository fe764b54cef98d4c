"""Kubernetes backend: the pod creator. A create runs to settlement, whatever its caller does.

Rules a reader must not break (paper §4.4, Appendix F, Table 2 rows 1 and 2):
* Every create carries a pre-assigned name and a nonce annotation. The HTTP call runs in a
  worker thread and runs to settlement even if the awaiting task is cancelled: a queued
  item that never started is withdrawn (nothing was sent); otherwise the provider waits
  for the answer and deletes whatever got stored, holding it in its pending set meanwhile.
* After a 5xx or a transport error the pod is read back by name and deleted with a UID
  precondition only if it carries this create's nonce; then ``ProviderAmbiguous`` with
  the identity and the HTTP status in ``extra``. A read-back that finds nothing is not the
  end: the create may still land, so it is handed to ``expect_late`` (``late.LateCreates``).
  A 403 or another 4xx sends no read and no delete. A 409 reads the holder: our nonce means
  an earlier attempt of this very create (adopted), any other is ``ProviderConflict`` and
  the pod is left alone.
* A 429 (shed, nothing stored) is sent again with the same name and nonce after its
  ``Retry-After``, an exceeded-quota 403 after a backoff (``retry.py`` decides both; the
  wait is the provider's injected ``sleep``, on the loop, between work items). A 422 is
  final: ``ProviderInvalid`` naming the refused fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandboxes import labels as L
from sandboxes.providers.base import Handle, SandboxSpec
from sandboxes.providers.kubernetes.calls import ApiCalls, Background
from sandboxes.providers.kubernetes.config import TRANSPORT_ERRORS, KubernetesConfig, describe
from sandboxes.providers.kubernetes.deleter import (
    DeleteHooks,
    PendingDelete,
    PodDeleter,
    Unconfirmed,
)
from sandboxes.providers.kubernetes.podbody import Body, PodBodies, post_pod
from sandboxes.providers.kubernetes.retry import (
    RetryPolicy,
    invalid_fields,
    is_quota_exceeded,
    status_body,
)
from sandman_site.errors import (
    ProviderAmbiguous,
    ProviderConflict,
    ProviderError,
    ProviderForbidden,
    ProviderInvalid,
)

log = logging.getLogger(__name__)


@dataclass
class CreateOutcome:
    """What the worker thread learned; turned into a handle or an error on the loop."""

    handle: Handle | None = None
    error: ProviderError | None = None
    pending: PendingDelete | None = None
    deleted: tuple[str, str] | None = None
    stored_at: float = 0.0  # time.monotonic() when the API confirmed the pod stored
    sent_at: float = 0.0  # time.monotonic() just before the create was sent
    version: str = ""  # the pod's resourceVersion in that answer
    retry_in: float | None = None  # refused with nothing stored: send again after this


def _meta(obj: client.V1Pod) -> client.V1ObjectMeta:
    return obj.metadata or client.V1ObjectMeta()


def _err(
    cls: type[ProviderError], message: str, extra: dict[str, Any], cause: BaseException
) -> ProviderError:
    error = cls(message, extra)
    error.__cause__ = cause
    return error


class PodCreator:
    """Creates pods: nonce, read-back after ambiguous answers, the 409 rules.

    ``deleter`` owns whatever a create leaves to delete; ``note_stored(name, uid, at,
    version)`` tells the readiness tracker a pod was stored; ``backend`` names the handles.
    """

    def __init__(
        self,
        core: client.CoreV1Api,
        config: KubernetesConfig,
        *,
        backend: str,
        calls: ApiCalls,
        background: Background,
        deleter: PodDeleter,
        hooks: DeleteHooks,
        ensure_started: Callable[[], object],
        note_stored: Callable[[str, str, float, str], None],
        retry: RetryPolicy,
        sleep: Callable[[float], Awaitable[None]],
        expect_late: Callable[[str, str, float], None],
    ) -> None:
        self._core, self._config, self._backend = core, config, backend
        self._calls, self._background = calls, background
        self._deleter, self._hooks = deleter, hooks
        self._ensure_started = ensure_started
        self._note_stored = note_stored
        self._retry, self._sleep = retry, sleep
        self._expect_late = expect_late
        self._bodies = PodBodies(core.api_client, config)  # the manifest, once per template

    async def create(self, spec: SandboxSpec) -> Handle:
        self._ensure_started()
        manifest = self._bodies.body(spec)
        attempt = 1
        while True:
            outcome = await self._send(manifest, spec, attempt)
            if outcome.retry_in is None:
                break
            # Nothing was stored: cancelled while waiting, there is nothing to clean up.
            await self._sleep(outcome.retry_in)
            attempt += 1
        if outcome.pending is not None and outcome.pending.terminating:
            if await self._deleter.await_gone(outcome.pending):  # reclaimed means gone
                outcome.pending = None  # confirmed (and reported) by the deleter
        return self._finish(outcome)

    async def _send(self, manifest: Body, spec: SandboxSpec, attempt: int) -> CreateOutcome:
        """One send of the create, run to settlement even if the caller is cancelled."""
        abandoned = threading.Event()
        work = self._calls.submit(
            "create", spec.name, self._create_sync, manifest, spec, abandoned, attempt
        )
        answer = asyncio.wrap_future(work)
        try:
            outcome = await asyncio.shield(answer)
        except asyncio.CancelledError:
            if work.cancel():  # still queued: no request was ever sent
                raise
            abandoned.set()  # if the thread has not sent it yet, it never will
            cleanup = self._background.spawn(self._settle_abandoned(answer, spec))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(cleanup)  # a second cancel leaves it to our task
            raise
        return outcome

    def _finish(self, outcome: CreateOutcome) -> Handle:
        if outcome.pending is not None:
            self._deleter.add_pending(outcome.pending)
        if outcome.deleted is not None:
            self._hooks.deleted(*outcome.deleted)
        if outcome.error is not None:
            if outcome.sent_at and outcome.error.extra.get("stored") is False:
                extra = outcome.error.extra
                if "held_by_other" not in extra:  # absent, not taken: it may still land
                    self._expect_late(extra["name"], extra["nonce"], outcome.sent_at)
            raise outcome.error
        if outcome.handle is None:
            raise ProviderError("create was not sent")
        if outcome.stored_at:
            self._note_stored(
                outcome.handle.name, outcome.handle.uid, outcome.stored_at, outcome.version
            )
        return outcome.handle

    async def _settle_abandoned(
        self, answer: asyncio.Future[CreateOutcome], spec: SandboxSpec
    ) -> None:
        """The caller is gone: own whatever the create stored and delete it."""
        try:
            handle = self._finish(await answer)
        except ProviderError as exc:
            log.info("abandoned create of %s settled without a pod to own: %s", spec.name, exc)
            return
        self._deleter.add_pending(PendingDelete(handle.name, handle.uid, handle.nonce))
        try:
            await self._deleter.destroy(handle)
        except ProviderError:
            log.warning("abandoned pod %s stays pending deletion", handle.name, exc_info=True)

    def _create_sync(
        self, manifest: Body, spec: SandboxSpec, abandoned: threading.Event, attempt: int
    ) -> CreateOutcome:
        if abandoned.is_set():
            return CreateOutcome()
        sent_at = time.monotonic()
        try:
            # Raw answer: deserializing the stored pod into client models cost more CPU than
            # the whole rest of the create; only its uid and resourceVersion are read. The
            # body is plain JSON (podbody.py): serializing client models cost as much again.
            resp: Any = post_pod(
                self._core,
                self._config.namespace,
                manifest,
                request_timeout=self._config.request_timeout_s,
            )
            try:
                stored = json.loads(resp.data).get("metadata") or {}
            finally:
                resp.release_conn()
        except ApiException as exc:
            status = exc.status or 0
            if status == 409:
                return self._conflict_sync(spec, exc)
            if 400 <= status < 500:
                delay = self._retry.create_delay(exc, attempt)
                if delay is not None:
                    return CreateOutcome(retry_in=delay)
                return CreateOutcome(error=self._refused(spec, exc, attempt))
            return replace(self._reclaim_sync(spec, exc), sent_at=sent_at)
        except (*TRANSPORT_ERRORS, ValueError) as exc:  # ValueError: a cut-off answer body
            return replace(self._reclaim_sync(spec, exc), sent_at=sent_at)
        return CreateOutcome(
            handle=Handle(spec.name, spec.nonce, self._backend, uid=stored.get("uid") or ""),
            stored_at=time.monotonic(),
            version=stored.get("resourceVersion") or "",
        )

    def _refused(self, spec: SandboxSpec, exc: ApiException, attempts: int) -> ProviderError:
        """A final 4xx: nothing stored, nothing to read back or delete."""
        status = exc.status or 0
        extra: dict[str, Any] = {
            "name": spec.name,
            "nonce": spec.nonce,
            "namespace": self._config.namespace,
            "status": status,
            "attempts": attempts,
        }
        server_says = str(status_body(exc).get("message") or "")
        fields = invalid_fields(exc) if status == 422 else []
        if status == 422:
            extra["fields"] = fields
            return _err(
                ProviderInvalid,
                f"pod {spec.name} is invalid ({', '.join(fields) or 'no field named'}): "
                f"{server_says}",
                extra,
                exc,
            )
        if status == 403:
            extra["quota_exceeded"] = is_quota_exceeded(exc)
        cls = ProviderForbidden if status == 403 else ProviderError
        message = f"create of pod {spec.name} refused ({describe(exc)}): {server_says}"
        return _err(cls, message, extra, exc)

    def _conflict_sync(self, spec: SandboxSpec, exc: ApiException) -> CreateOutcome:
        extra: dict[str, Any] = {"name": spec.name, "nonce": spec.nonce, "status": 409}
        holder: client.V1ObjectMeta | None
        try:
            holder = _meta(
                self._core.read_namespaced_pod(
                    spec.name,
                    self._config.namespace,
                    _request_timeout=self._config.request_timeout_s,
                )
            )
        except (ApiException, *TRANSPORT_ERRORS):
            holder = None
        if holder is not None and (holder.annotations or {}).get(L.NONCE_ANNOTATION) == spec.nonce:
            return CreateOutcome(
                handle=Handle(spec.name, spec.nonce, self._backend, uid=holder.uid or "")
            )
        extra["holder_uid"] = holder.uid if holder is not None else None
        return CreateOutcome(
            error=_err(
                ProviderConflict,
                f"pod {spec.name} is held by another workload; left alone",
                extra,
                exc,
            )
        )

    def _reclaim_sync(self, spec: SandboxSpec, cause: BaseException) -> CreateOutcome:
        """Ambiguous answer: read back by name, delete only on our nonce (UID precondition)."""
        extra: dict[str, Any] = {
            "name": spec.name,
            "nonce": spec.nonce,
            "namespace": self._config.namespace,
            "cause": describe(cause),
            # The API server's HTTP status (0 for a transport error): the create-error
            # detector counts the 5xx among the recorded create outcomes.
            "status": (cause.status or 0) if isinstance(cause, ApiException) else 0,
        }
        message = f"create of pod {spec.name} ended ambiguously ({describe(cause)})"
        read_error: BaseException
        try:
            pod = _meta(
                self._core.read_namespaced_pod(
                    spec.name,
                    self._config.namespace,
                    _request_timeout=self._config.request_timeout_s,
                )
            )
        except ApiException as exc:
            if exc.status == 404:
                extra.update(stored=False, reclaimed=False)
                return CreateOutcome(
                    error=_err(ProviderAmbiguous, message + "; not stored", extra, cause)
                )
            read_error = exc
        except TRANSPORT_ERRORS as exc:
            read_error = exc
        else:
            return self._reclaim_stored(spec, pod, message, extra, cause)
        # Cannot tell: own it by name and nonce until a read settles it.
        extra.update(
            stored=None, reclaimed=False, pending_delete=True, read_error=describe(read_error)
        )
        pending = PendingDelete(spec.name, "", spec.nonce, last_error=describe(read_error))
        return CreateOutcome(
            error=_err(ProviderAmbiguous, message + "; read-back failed", extra, cause),
            pending=pending,
        )

    def _reclaim_stored(
        self,
        spec: SandboxSpec,
        pod: client.V1ObjectMeta,
        message: str,
        extra: dict[str, Any],
        cause: BaseException,
    ) -> CreateOutcome:
        """The read-back found a pod by our name: delete it only if it carries our nonce."""
        if (pod.annotations or {}).get(L.NONCE_ANNOTATION) != spec.nonce:
            extra.update(stored=False, reclaimed=False, held_by_other=pod.uid)
            return CreateOutcome(
                error=_err(
                    ProviderAmbiguous, message + "; the name is another workload's", extra, cause
                )
            )
        uid = pod.uid or ""
        extra.update(stored=True, uid=uid)
        try:
            how = self._deleter.delete_sync(spec.name, uid)
        except Unconfirmed as exc:
            extra.update(reclaimed=False, pending_delete=True)
            pending = PendingDelete(spec.name, uid, spec.nonce, last_error=str(exc))
            return CreateOutcome(
                error=_err(ProviderAmbiguous, message + "; delete pending", extra, cause),
                pending=pending,
            )
        if how == "deleted":  # accepted: Terminating until gone, which confirms it
            extra.update(reclaimed=True, terminating=True)
            pending = PendingDelete(spec.name, uid, spec.nonce, terminating=True)
            return CreateOutcome(
                error=_err(ProviderAmbiguous, message + "; stored pod deleted", extra, cause),
                pending=pending,
            )
        extra.update(reclaimed=True)
        return CreateOutcome(
            error=_err(ProviderAmbiguous, message + "; stored pod deleted", extra, cause),
            deleted=(spec.name, uid),
        )
