"""Kubernetes backend: every pod carrying Sandman's managed-by label, whoever created it.

The controller's reconcile and sweep read this list to adopt pods the database knows
and delete the rest. Rule a reader must not break: the list is one API call on the
provider's executor, selected by label only -- never by this process's own records,
so a restarted service sees the pods its predecessor created.
"""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandboxes import labels as L
from sandboxes.providers.base import OwnedSandbox
from sandboxes.providers.kubernetes.calls import ApiCalls
from sandboxes.providers.kubernetes.config import (
    SELECTOR,
    TRANSPORT_ERRORS,
    KubernetesConfig,
    describe,
)
from sandman_site.errors import ProviderError


def owned_sandbox(pod: client.V1Pod) -> OwnedSandbox:
    meta = pod.metadata or client.V1ObjectMeta()
    labels = meta.labels or {}
    job = labels.get(L.JOB, "")
    return OwnedSandbox(
        name=meta.name or "",
        uid=meta.uid or "",
        nonce=(meta.annotations or {}).get(L.NONCE_ANNOTATION, ""),
        job_id=int(job) if job.isdigit() else None,
        role=labels.get(L.ROLE, ""),
        phase=(pod.status.phase or "") if pod.status else "",
        created=meta.creation_timestamp,
        terminating=meta.deletion_timestamp is not None,
    )


class PodLister:
    """Lists Sandman's pods in the namespace."""

    def __init__(
        self,
        core: client.CoreV1Api,
        config: KubernetesConfig,
        *,
        calls: ApiCalls,
        ensure_started: Callable[[], object],
    ) -> None:
        self._core, self._config, self._calls = core, config, calls
        self._ensure_started = ensure_started

    async def list_owned(self) -> list[OwnedSandbox]:
        self._ensure_started()
        core, ns, timeout = self._core, self._config.namespace, self._config.request_timeout_s
        try:
            pods = await self._calls.run(
                "list",
                "",
                lambda: core.list_namespaced_pod(
                    ns, label_selector=SELECTOR, _request_timeout=timeout
                ),
            )
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise ProviderError(f"listing Sandman's pods failed: {describe(exc)}") from exc
        return [owned_sandbox(pod) for pod in pods.items]
