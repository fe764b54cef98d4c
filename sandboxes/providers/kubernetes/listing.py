"""Kubernetes backend: every pod carrying Sandman's managed-by label, whoever created it.

The controller's reconcile and sweep read this list to adopt pods the database knows
and delete the rest. Rules a reader must not break: the list is selected by label only --
never by this process's own records, so a restarted service sees the pods its predecessor
created; it is read in pages (``paging.py``) and turned into ``OwnedSandbox`` rows inside
ONE work item on the provider's executor, so neither the pages nor the row building ever
run on the controller's loop.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandboxes import labels as L
from sandboxes.providers.base import OwnedSandbox
from sandboxes.providers.kubernetes.calls import ApiCalls
from sandboxes.providers.kubernetes.config import TRANSPORT_ERRORS, KubernetesConfig, describe
from sandboxes.providers.kubernetes.paging import pod_pages
from sandboxes.providers.kubernetes.retry import RetryPolicy
from sandman_site.errors import ProviderError


def _created(text: Any) -> dt.datetime | None:
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def owned_sandbox(pod: dict[str, Any]) -> OwnedSandbox:
    """The row of one listed pod (raw JSON, as the pages come)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    job = str(labels.get(L.JOB, ""))
    return OwnedSandbox(
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        nonce=(meta.get("annotations") or {}).get(L.NONCE_ANNOTATION, ""),
        job_id=int(job) if job.isdigit() else None,
        role=labels.get(L.ROLE, ""),
        phase=(pod.get("status") or {}).get("phase") or "",
        created=_created(meta.get("creationTimestamp")),
        terminating=meta.get("deletionTimestamp") is not None,
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
        self._retry = RetryPolicy(config, lambda n: 0.0)

    async def list_owned(self) -> list[OwnedSandbox]:
        self._ensure_started()
        try:
            return await self._calls.run("list", "", self._list_sync)
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise ProviderError(f"listing Sandman's pods failed: {describe(exc)}") from exc

    def _list_sync(self) -> list[OwnedSandbox]:
        """In the worker thread: every page, then every row."""
        pages = pod_pages(self._core, self._config, self._retry, threading.Event().wait)
        items, _ = pages.list_all()
        return [owned_sandbox(pod) for pod in items]
