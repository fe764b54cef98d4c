"""Kubernetes backend, part 3: deletes until confirmed, the pending set, owners and anchors.

Rules a reader must not break (paper §4.4, Appendix F, Table 2 row 3):
* ``destroy`` is idempotent: 404 -- or 409 on the UID precondition (the name now holds
  another object) -- means gone. A delete that fails, loses its answer or is cancelled
  enters the pending set (``on_pending``), is retried with backoff 1 s -> 30 s and leaves
  the set only when confirmed (``on_deleted``).
* A pending entry known only by name is read back first and deleted only if it carries
  its nonce (or, without a nonce, Sandman's managed-by label): never another tenant's pod.
* Owners: a job's pods name the trainer pod when it lives in the sandbox namespace, else
  the job's anchor ConfigMap (created on the job's first create, deleted at drain). A
  cross-namespace owner would make the garbage collector delete the pod at once.
  ``list_anchors`` lets the controller's sweep delete anchors a drain left behind.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandboxes import labels as L
from sandboxes.providers.base import Handle, OwnerRef
from sandboxes.providers.kubernetes.manifest import SELECTOR, TRANSPORT_ERRORS, describe
from sandman_site.errors import ProviderError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PendingDelete:
    """A pod Sandman owns and must delete; ``uid`` is empty when only the name is known."""

    name: str
    uid: str
    nonce: str
    attempts: int = 0
    last_error: str = ""


class Unconfirmed(Exception):
    """A delete whose outcome is unknown or failed: keep the pod pending."""


class DeleteMixin:
    """Deletes, the pending set, owners and anchors of :class:`KubernetesProvider`."""

    # --- delete ---------------------------------------------------------------------------
    def _delete_sync(self, name: str, uid: str, resource: str = "pods") -> str:
        """One delete with a UID precondition. Returns how it was confirmed, or raises."""
        body = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
            propagation_policy="Background",
        )
        call = (
            self.core.delete_namespaced_pod
            if resource == "pods"
            else self.core.delete_namespaced_config_map
        )
        try:
            call(
                name,
                self.config.namespace,
                body=body,
                _request_timeout=self.config.request_timeout_s,
            )
        except ApiException as exc:
            if exc.status == 404:
                return "gone"
            if exc.status == 409 and uid:
                return "replaced"  # the name now holds someone else's object: ours is gone
            raise Unconfirmed(describe(exc)) from exc
        except TRANSPORT_ERRORS as exc:
            raise Unconfirmed(describe(exc)) from exc
        return "deleted"

    def _delete_pending_sync(self, entry: PendingDelete) -> str:
        uid = entry.uid
        if not uid:  # only the name is known: read it back and check the nonce first
            try:
                pod = self.core.read_namespaced_pod(
                    entry.name,
                    self.config.namespace,
                    _request_timeout=self.config.request_timeout_s,
                )
            except ApiException as exc:
                if exc.status == 404:
                    return "gone"
                raise Unconfirmed(describe(exc)) from exc
            except TRANSPORT_ERRORS as exc:
                raise Unconfirmed(describe(exc)) from exc
            nonce = (pod.metadata.annotations or {}).get(L.NONCE_ANNOTATION)
            managed = (pod.metadata.labels or {}).get(L.MANAGED_BY) == L.VALUE_MANAGED_BY
            # Without a nonce (a handle rebuilt from a listing) our label must be there.
            if (nonce != entry.nonce) if entry.nonce else not managed:
                return "not_ours"
            uid = pod.metadata.uid
        return self._delete_sync(entry.name, uid)

    def _add_pending(self, entry: PendingDelete) -> None:
        if entry.name not in self._pending:
            self._pending[entry.name] = entry
            self._hook(self.on_pending, entry)
        if self.config.retry_pending_in_background and not self._closed:
            if self._retrier is None or self._retrier.done():
                self._retrier = self._spawn(self._retry_pending())

    def _confirm(self, name: str, uid: str) -> None:
        self._pending.pop(name, None)
        if name in self._stored and self._stored[name][0] in ("", uid):
            del self._stored[name]
        self._hook(self.on_deleted, name, uid)

    async def destroy(self, handle: Handle) -> None:
        self._ensure_started()
        entry = PendingDelete(handle.name, handle.uid, handle.nonce)
        last = ""
        try:
            for attempt in range(max(1, self.config.destroy_attempts)):
                if attempt:
                    await self._sleep(self._backoff(attempt - 1))
                try:
                    await self._in_thread("delete", handle.name, self._delete_pending_sync, entry)
                except Unconfirmed as exc:
                    last = str(exc)
                    self._add_pending(replace(entry, attempts=attempt + 1, last_error=last))
                    continue
                self._confirm(handle.name, handle.uid)
                return
        except asyncio.CancelledError:
            self._add_pending(entry)  # the delete may be in flight: keep owning the pod
            raise
        raise ProviderError(
            f"delete of pod {handle.name} not confirmed ({last}); kept pending",
            {"name": handle.name, "uid": handle.uid, "pending": True, "last_error": last},
        )

    def pending_deletes(self) -> list[PendingDelete]:
        return list(self._pending.values())

    def add_pending(self, name: str, uid: str, nonce: str) -> None:
        """Adopt a pending delete recorded elsewhere (the pool's table after a restart)."""
        self._ensure_started()
        self._add_pending(PendingDelete(name, uid, nonce))

    async def flush_pending(self) -> int:
        """Try every pending delete once; returns how many were confirmed."""
        self._ensure_started()
        confirmed = 0
        for entry in list(self._pending.values()):
            try:
                await self._in_thread("delete", entry.name, self._delete_pending_sync, entry)
            except Unconfirmed as exc:
                if entry.name in self._pending:
                    self._pending[entry.name] = replace(
                        entry, attempts=entry.attempts + 1, last_error=str(exc)
                    )
                continue
            self._confirm(entry.name, entry.uid)
            confirmed += 1
        return confirmed

    async def _retry_pending(self) -> None:
        attempt = 0
        while self._pending and not self._closed:
            await self._sleep(self._backoff(attempt))
            attempt = 0 if await self.flush_pending() else attempt + 1

    # --- per-job anchor ---------------------------------------------------------------------
    @staticmethod
    def anchor_name(job_id: int) -> str:
        return f"sandman-job-{job_id}"

    async def ensure_anchor(self, job_id: int) -> OwnerRef:
        """The job's anchor ConfigMap (created once); pods name it as their owner."""
        self._ensure_started()
        name = self.anchor_name(job_id)
        body = client.V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=client.V1ObjectMeta(
                name=name, labels={L.MANAGED_BY: L.VALUE_MANAGED_BY, L.JOB: str(job_id)}
            ),
            data={"job": str(job_id)},
        )

        def ensure() -> client.V1ConfigMap:
            ns, timeout = self.config.namespace, self.config.request_timeout_s
            try:
                return self.core.create_namespaced_config_map(ns, body, _request_timeout=timeout)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            return self.core.read_namespaced_config_map(name, ns, _request_timeout=timeout)

        try:
            anchor = await self._in_thread("anchor", name, ensure)
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise ProviderError(
                f"anchor {name} could not be ensured: {describe(exc)}", {"job_id": job_id}
            ) from exc
        return OwnerRef(kind=L.ANCHOR_KIND, name=name, uid=anchor.metadata.uid)

    async def owner_for(self, job_id: int, trainer: OwnerRef | None = None) -> OwnerRef:
        """The owner the job's pods name: ``trainer`` if that pod lives in the sandbox
        namespace with that uid, else the job's anchor (created now if needed).

        Resolved once per job and cached; concurrent first creates share one lookup. A
        failed lookup is not cached (the next create asks again).
        """
        future = self._owners.get(job_id)
        if future is None or (future.done() and (future.cancelled() or future.exception())):
            future = asyncio.ensure_future(self._resolve_owner(job_id, trainer))
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._owners[job_id] = future
        return await asyncio.shield(future)

    async def _resolve_owner(self, job_id: int, trainer: OwnerRef | None) -> OwnerRef:
        self._ensure_started()
        if trainer is not None:
            ns, timeout = self.config.namespace, self.config.request_timeout_s

            def read() -> Any:
                try:
                    return self.core.read_namespaced_pod(trainer.name, ns, _request_timeout=timeout)
                except ApiException as exc:
                    if exc.status == 404:
                        return None
                    raise

            try:
                pod = await self._in_thread("get", trainer.name, read)
            except (ApiException, *TRANSPORT_ERRORS) as exc:
                raise ProviderError(
                    f"trainer pod {trainer.name} could not be read: {describe(exc)}",
                    {"job_id": job_id},
                ) from exc
            if pod is not None and pod.metadata.uid == trainer.uid:
                return replace(trainer, kind="Pod", api_version="v1")
            # Another namespace (or gone): naming it would get every pod collected at once.
            log.info("trainer pod %s is not in %s: job %s uses an anchor", trainer.name, ns, job_id)
        return await self.ensure_anchor(job_id)

    async def list_anchors(self) -> list[int]:
        """Job ids of every anchor ConfigMap carrying Sandman's managed-by label.

        Only a ConfigMap named as :meth:`anchor_name` names for its job label counts: the
        sweep deletes by that name, never another object that happens to carry the label.
        """
        self._ensure_started()
        ns, timeout = self.config.namespace, self.config.request_timeout_s
        try:
            found = await self._in_thread(
                "list",
                "",
                lambda: self.core.list_namespaced_config_map(
                    ns, label_selector=SELECTOR, _request_timeout=timeout
                ),
            )
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise ProviderError(f"listing Sandman's anchors failed: {describe(exc)}") from exc
        job_ids = []
        for item in found.items:
            job = (item.metadata.labels or {}).get(L.JOB, "")
            if job.isdigit() and item.metadata.name == self.anchor_name(int(job)):
                job_ids.append(int(job))
        return sorted(job_ids)

    async def delete_anchor(self, job_id: int) -> None:
        """Delete the job's anchor; the garbage collector then deletes every pod it owns."""
        self._ensure_started()
        self._owners.pop(job_id, None)
        name = self.anchor_name(job_id)
        for attempt in range(max(1, self.config.destroy_attempts)):
            if attempt:
                await self._sleep(self._backoff(attempt - 1))
            try:
                await self._in_thread("delete", name, self._delete_sync, name, "", "configmaps")
                return
            except Unconfirmed as exc:
                last = str(exc)
        raise ProviderError(f"delete of anchor {name} not confirmed ({last})", {"job_id": job_id})
