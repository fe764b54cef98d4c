"""Kubernetes backend: who owns a job's pods -- the trainer pod or the job's anchor.

Rules a reader must not break (paper §4.4):
* A job's pods name the trainer pod only when it lives in the sandbox namespace with the
  uid the job declared; otherwise the job's anchor ConfigMap (created on the job's first
  create, deleted at drain). A cross-namespace owner would make the garbage collector
  delete the pod at once.
* The owner is resolved once per job and cached; concurrent first creates share one
  lookup; a failed lookup is not cached (the next create asks again).
* Only a ConfigMap named :func:`anchor_name` for its job label counts as an anchor: the
  sweep deletes by that name, never another object that happens to carry the label.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandboxes import labels as L
from sandboxes.providers.base import OwnerRef
from sandboxes.providers.kubernetes.calls import ApiCalls
from sandboxes.providers.kubernetes.config import (
    SELECTOR,
    TRANSPORT_ERRORS,
    KubernetesConfig,
    describe,
    job_ids_named,
)
from sandboxes.providers.kubernetes.deleter import Unconfirmed, delete_object
from sandman_site.errors import ProviderError

log = logging.getLogger(__name__)


def anchor_name(job_id: int) -> str:
    return f"sandman-job-{job_id}"


class Anchors:
    """Owner references of a job's pods and the per-job anchor ConfigMaps."""

    def __init__(
        self,
        core: client.CoreV1Api,
        config: KubernetesConfig,
        *,
        calls: ApiCalls,
        ensure_started: Callable[[], object],
        sleep: Callable[[float], Awaitable[None]],
        backoff: Callable[[int], float],
    ) -> None:
        self._core, self._config, self._calls = core, config, calls
        self._ensure_started = ensure_started
        self._sleep, self._backoff = sleep, backoff
        self._owners: dict[int, asyncio.Future[OwnerRef]] = {}  # job id -> pods' owner

    async def ensure_anchor(self, job_id: int) -> OwnerRef:
        """The job's anchor ConfigMap (created once); pods name it as their owner."""
        self._ensure_started()
        name = anchor_name(job_id)
        body = client.V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=client.V1ObjectMeta(
                name=name, labels={L.MANAGED_BY: L.VALUE_MANAGED_BY, L.JOB: str(job_id)}
            ),
            data={"job": str(job_id)},
        )
        core, ns, timeout = self._core, self._config.namespace, self._config.request_timeout_s

        def ensure() -> client.V1ConfigMap:
            try:
                return core.create_namespaced_config_map(ns, body, _request_timeout=timeout)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            return core.read_namespaced_config_map(name, ns, _request_timeout=timeout)

        try:
            anchor = await self._calls.run("anchor", name, ensure)
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise ProviderError(
                f"anchor {name} could not be ensured: {describe(exc)}", {"job_id": job_id}
            ) from exc
        uid = anchor.metadata.uid if anchor.metadata is not None else None
        return OwnerRef(kind=L.ANCHOR_KIND, name=name, uid=uid or "")

    async def owner_for(self, job_id: int, trainer: OwnerRef | None) -> OwnerRef:
        """The owner the job's pods name: ``trainer`` if that pod lives in the sandbox
        namespace with that uid, else the job's anchor (created now if needed)."""
        future = self._owners.get(job_id)
        if future is None or (future.done() and (future.cancelled() or future.exception())):
            future = asyncio.ensure_future(self._resolve_owner(job_id, trainer))
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._owners[job_id] = future
        return await asyncio.shield(future)

    async def _resolve_owner(self, job_id: int, trainer: OwnerRef | None) -> OwnerRef:
        self._ensure_started()
        if trainer is not None:
            core, ns = self._core, self._config.namespace
            timeout = self._config.request_timeout_s

            def read() -> client.V1Pod | None:
                try:
                    return core.read_namespaced_pod(trainer.name, ns, _request_timeout=timeout)
                except ApiException as exc:
                    if exc.status == 404:
                        return None
                    raise

            try:
                pod = await self._calls.run("get", trainer.name, read)
            except (ApiException, *TRANSPORT_ERRORS) as exc:
                raise ProviderError(
                    f"trainer pod {trainer.name} could not be read: {describe(exc)}",
                    {"job_id": job_id},
                ) from exc
            if pod is not None and pod.metadata is not None and pod.metadata.uid == trainer.uid:
                return replace(trainer, kind="Pod", api_version="v1")
            # Another namespace (or gone): naming it would get every pod collected at once.
            log.info("trainer pod %s is not in %s: job %s uses an anchor", trainer.name, ns, job_id)
        return await self.ensure_anchor(job_id)

    async def list_anchors(self) -> list[int]:
        """Job ids of every anchor ConfigMap carrying Sandman's managed-by label."""
        self._ensure_started()
        core, ns, timeout = self._core, self._config.namespace, self._config.request_timeout_s
        try:
            found = await self._calls.run(
                "list",
                "",
                lambda: core.list_namespaced_config_map(
                    ns, label_selector=SELECTOR, _request_timeout=timeout
                ),
            )
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise ProviderError(f"listing Sandman's anchors failed: {describe(exc)}") from exc
        return job_ids_named(found.items, anchor_name)

    async def delete_anchor(self, job_id: int) -> None:
        """Delete the job's anchor; the garbage collector then deletes every pod it owns."""
        self._ensure_started()
        self._owners.pop(job_id, None)
        name = anchor_name(job_id)
        last = ""
        for attempt in range(max(1, self._config.destroy_attempts)):
            if attempt:
                await self._sleep(self._backoff(attempt - 1))
            try:
                await self._calls.run(
                    "delete", name, delete_object, self._core, self._config, name, "", "configmaps"
                )
                return
            except Unconfirmed as exc:
                last = str(exc)
        raise ProviderError(f"delete of anchor {name} not confirmed ({last})", {"job_id": job_id})
