"""Kubernetes backend: one list (Sandman's pods, or the namespace's pod Events), read in
pages of ``list_page_size``.

"Retrieving large results sets in chunks" (Kubernetes API Concepts): each request carries
``limit`` and the previous page's ``continue`` token; every page of one list comes from the
same snapshot, whose ``resourceVersion`` is the first page's. A 410 on a continue token
(its snapshot was compacted) restarts the list from its first page -- the fresh token the
server offers would give an inconsistent list -- at most ``list_restarts`` times. A 429 on a
page is waited out (``Retry-After``) and the same page asked again.

Rules a reader must not break: this runs in a worker thread, never on an event loop (a
12,000-pod list is tens of MB of JSON); pages stay raw JSON (no client models); the version
returned is the first page's, the one a watch may resume from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandboxes.providers.kubernetes.config import SELECTOR, KubernetesConfig
from sandboxes.providers.kubernetes.fastjson import loads
from sandboxes.providers.kubernetes.retry import RetryPolicy, status_of

Pod = dict[str, Any]
# One list request: the client's ``list_namespaced_*`` with its selector bound; called with
# ``limit`` / ``_continue`` (paging) or ``watch=True`` and its watch arguments; answers
# urllib3's raw response (``_preload_content=False``).
ListCall = Callable[..., Any]


def pod_list_call(core: client.CoreV1Api, config: KubernetesConfig) -> ListCall:
    """Sandman's pods in the namespace (the managed-by label)."""

    def call(**kwargs: Any) -> Any:
        return core.list_namespaced_pod(
            config.namespace, label_selector=SELECTOR, _preload_content=False, **kwargs
        )

    return call


def checked(resp: Any) -> Any:
    """Check a ``_preload_content=False`` answer's status like the client would."""
    status = getattr(resp, "status", 200)
    if not 200 <= status <= 299:
        try:
            raise ApiException(http_resp=resp)
        finally:
            resp.release_conn()
    return resp


class Pages:
    """Reads the whole list of one ``ListCall``, page by page, in the calling thread."""

    def __init__(
        self,
        call: ListCall,
        config: KubernetesConfig,
        retry: RetryPolicy,
        wait: Callable[[float], object],
    ) -> None:
        self._call, self._config, self._retry, self._wait = call, config, retry, wait
        self.restarts = 0  # lists started again after an expired continue token
        self.pages = 0

    def list_all(self) -> tuple[list[Pod], str]:
        """Every listed item and the list's (first page's) resourceVersion."""
        restarts = 0
        while True:
            try:
                return self._one_list()
            except ApiException as exc:
                if status_of(exc) != 410 or restarts >= self._config.list_restarts:
                    raise
                restarts += 1
                self.restarts += 1

    def _one_list(self) -> tuple[list[Pod], str]:
        items: list[Pod] = []
        token: str | None = None
        version: str | None = None
        while True:
            page = self._page(token)
            meta = page.get("metadata") or {}
            if version is None:
                version = str(meta.get("resourceVersion") or "")
            items.extend(page.get("items") or [])
            token = meta.get("continue") or None
            if token is None:
                return items, version

    def _page(self, token: str | None) -> dict[str, Any]:
        cfg = self._config
        kwargs: dict[str, Any] = {}
        if cfg.list_page_size > 0:
            kwargs["limit"] = cfg.list_page_size
        if token:
            kwargs["_continue"] = token
        attempt = 0
        while True:
            attempt += 1
            try:
                resp = checked(self._call(_request_timeout=cfg.request_timeout_s, **kwargs))
            except ApiException as exc:
                delay = self._retry.read_delay(exc, attempt)
                if delay is None:
                    raise
                self._wait(delay)
                continue
            try:
                self.pages += 1
                return dict(loads(resp.data))
            finally:
                resp.release_conn()


def pod_pages(
    core: client.CoreV1Api,
    config: KubernetesConfig,
    retry: RetryPolicy,
    wait: Callable[[float], object],
) -> Pages:
    """The pages of Sandman's pods."""
    return Pages(pod_list_call(core, config), config, retry, wait)
