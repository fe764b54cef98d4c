"""Kubernetes backend: the per-job Secret that holds a job's execd key.

A sandbox's token is HMAC-SHA256(job key, pod name) (``execd/tokens.py``); its pod gets the
key from this Secret (mounted into the carrier init container only, see ``manifest.py``),
never a token in its spec, so no pod object carries a credential and no Secret per sandbox
is needed.

Rules a reader must not break:
* The Secret is ensured (created, or found) before the job's first pod is sent: a pod whose
  Secret is missing cannot start. Concurrent first creates share one ensure; a failed one is
  not cached (the next create asks again).
* It names the same owner as the job's pods (the trainer pod or the job's anchor), so the
  garbage collector removes it with them; it is deleted at drain with the anchor, and the
  sweep deletes it when stale, like an anchor (``provider.delete_anchor``).
* Only a Secret named :func:`secret_name` for its job label counts; the key is never
  logged, and errors name the Secret, never its data.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

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
from sandboxes.providers.kubernetes.retry import RetryPolicy
from sandman_site.errors import ProviderError

SECRET_KEY = "key"  # the one data key of a job's Secret


def secret_name(job_id: int) -> str:
    return f"sandman-job-{job_id}-execd"


class JobSecrets:
    """Create, list and delete the per-job execd-key Secrets."""

    def __init__(
        self,
        core: client.CoreV1Api,
        config: KubernetesConfig,
        *,
        calls: ApiCalls,
        ensure_started: Callable[[], object],
        sleep: Callable[[float], Awaitable[None]],
        backoff: Callable[[int], float],
        retry: RetryPolicy,
    ) -> None:
        self._core, self._config, self._calls = core, config, calls
        self._ensure_started = ensure_started
        self._sleep, self._backoff = sleep, backoff
        self._retry = retry
        self._ensured: dict[int, asyncio.Future[None]] = {}

    async def ensure(self, job_id: int, key: str, owner: OwnerRef | None) -> None:
        """The job's Secret exists (created once per job and process)."""
        if not key:
            raise ProviderError("the job has no execd key", {"job_id": job_id})
        future = self._ensured.get(job_id)
        if future is None or (future.done() and (future.cancelled() or future.exception())):
            future = asyncio.ensure_future(self._ensure(job_id, key, owner))
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
            self._ensured[job_id] = future
        await asyncio.shield(future)

    async def _ensure(self, job_id: int, key: str, owner: OwnerRef | None) -> None:
        self._ensure_started()
        name = secret_name(job_id)
        owners = None
        if owner is not None:
            owners = [
                client.V1OwnerReference(
                    api_version=owner.api_version,
                    kind=owner.kind,
                    name=owner.name,
                    uid=owner.uid,
                    controller=False,
                    block_owner_deletion=False,
                )
            ]
        body = client.V1Secret(
            api_version="v1",
            kind="Secret",
            type="Opaque",
            metadata=client.V1ObjectMeta(
                name=name,
                labels={L.MANAGED_BY: L.VALUE_MANAGED_BY, L.JOB: str(job_id)},
                owner_references=owners,
            ),
            string_data={SECRET_KEY: key},
        )
        core, ns, timeout = self._core, self._config.namespace, self._config.request_timeout_s

        def ensure() -> None:
            try:
                core.create_namespaced_secret(ns, body, _request_timeout=timeout)
            except ApiException as exc:
                if exc.status != 409:  # 409: it exists (an earlier process made it)
                    raise

        attempt = 0
        while True:  # creating a Secret that may exist is idempotent: a resend is safe
            attempt += 1
            try:
                await self._calls.run("secret", name, ensure)
                return
            except (ApiException, *TRANSPORT_ERRORS) as exc:
                delay = self._retry.idempotent_delay(exc, attempt)
                if delay is None:
                    raise ProviderError(
                        f"secret {name} could not be ensured: {describe(exc)}",
                        {"job_id": job_id},
                    ) from exc
            await self._sleep(delay)

    async def list_jobs(self) -> list[int]:
        """Job ids of every job Secret carrying Sandman's managed-by label."""
        self._ensure_started()
        core, ns, timeout = self._core, self._config.namespace, self._config.request_timeout_s
        try:
            found = await self._calls.run(
                "list",
                "",
                lambda: core.list_namespaced_secret(
                    ns, label_selector=SELECTOR, _request_timeout=timeout
                ),
            )
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise ProviderError(f"listing Sandman's job secrets failed: {describe(exc)}") from exc
        return job_ids_named(found.items, secret_name)

    async def delete(self, job_id: int) -> None:
        """Delete the job's Secret (gone already counts); retried, then a ProviderError."""
        self._ensure_started()
        self._ensured.pop(job_id, None)
        name = secret_name(job_id)
        core, ns, timeout = self._core, self._config.namespace, self._config.request_timeout_s

        def delete() -> None:
            try:
                core.delete_namespaced_secret(name, ns, _request_timeout=timeout)
            except ApiException as exc:
                if exc.status != 404:
                    raise

        last = ""
        for attempt in range(max(1, self._config.destroy_attempts)):
            if attempt:
                await self._sleep(self._backoff(attempt - 1))
            try:
                await self._calls.run("delete", name, delete)
                return
            except (ApiException, *TRANSPORT_ERRORS) as exc:
                last = describe(exc)
        raise ProviderError(f"delete of secret {name} not confirmed ({last})", {"job_id": job_id})
