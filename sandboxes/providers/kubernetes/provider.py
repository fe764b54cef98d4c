"""Kubernetes backend: one pod per sandbox, readiness from ONE list+watch of Sandman's pods.

The provider is split by concern; this module holds the class and its plumbing and
re-exports the public names:

* ``k8s_manifest``  -- :class:`KubernetesConfig`, :func:`build_pod_manifest`, the execd
  boot command and launcher, :func:`build_api_client`;
* ``k8s_informer``  -- readiness facts from raw pod JSON and :class:`PodInformer`;
* ``k8s_readiness`` -- informer callbacks, ``wait_ready``, ``health``;
* ``k8s_creates``   -- ``create``: nonce, read-back after ambiguous answers, 409 rules;
* ``k8s_deletes``   -- ``destroy``, the pending set, owners and the per-job anchor.

Ownership rules a reader must not break (paper §4.4, Appendix F; ``base.py``):

* A create runs to settlement even if the awaiting task is cancelled; whatever it stored
  is handed back, or deleted, or held in the pending set until a delete is confirmed.
* After a 5xx or a transport error the pod is read back by name and deleted (UID
  precondition) only if it carries this create's nonce. A 4xx sends no read and no
  delete; a 409 for a pod without our nonce is ``ProviderConflict`` and it is left alone.
* ``destroy`` is idempotent; an unconfirmed delete stays pending until confirmed.
* Every blocking client call runs on the provider's own executor (``max_workers``
  threads, one connection each); ``work_item_hook(op, name)`` runs first in that thread,
  so a test gate can hold a call before any request is sent (and, with ``op="health"``,
  an execd health probe). ``sleep`` is the only clock of backoffs and readiness budgets.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sandboxes import labels as L
from sandboxes.providers.base import OwnedSandbox, OwnerRef
from sandboxes.providers.kubernetes.creator import CreateMixin
from sandboxes.providers.kubernetes.deleter import DeleteMixin, PendingDelete
from sandboxes.providers.kubernetes.informer import (
    Pod,
    PodInformer,
    pod_failure,
    pod_is_ready,
    ready_info,
)
from sandboxes.providers.kubernetes.manifest import (
    DEFAULT_CARRIER_IMAGE,
    SELECTOR,
    TRANSPORT_ERRORS,
    KubernetesConfig,
    boot_command,
    build_api_client,
    build_pod_manifest,
    describe,
    execd_launcher,
    pod_labels,
)
from sandboxes.providers.kubernetes.readiness import ReadinessMixin, Waiter
from sandman_site.errors import ProviderError, SandboxNotReady

__all__ = [
    "DEFAULT_CARRIER_IMAGE",
    "SELECTOR",
    "KubernetesConfig",
    "KubernetesProvider",
    "PendingDelete",
    "PodInformer",
    "boot_command",
    "build_api_client",
    "build_pod_manifest",
    "execd_launcher",
    "pod_failure",
    "pod_is_ready",
    "pod_labels",
    "ready_info",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


class KubernetesProvider(ReadinessMixin, CreateMixin, DeleteMixin):
    name = "kubernetes"

    def __init__(
        self,
        config: KubernetesConfig | None = None,
        *,
        api_client: client.ApiClient | None = None,
        backoff: Callable[[int], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_pending: Callable[[PendingDelete], None] | None = None,
        on_deleted: Callable[[str, str], None] | None = None,
        work_item_hook: Callable[[str, str], None] | None = None,
    ) -> None:
        self.config = config or KubernetesConfig()
        self._owns_client = api_client is None
        self.api_client = api_client or build_api_client(self.config)
        self.core = client.CoreV1Api(self.api_client)
        self._backoff = backoff or (
            lambda n: min(self.config.backoff_max_s, self.config.backoff_initial_s * 2**n)
        )
        self._sleep = sleep
        self.on_pending, self.on_deleted = on_pending, on_deleted
        self.work_item_hook = work_item_hook
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.config.max_workers, thread_name_prefix="sandman-k8s"
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.informer: PodInformer | None = None
        self._cache: dict[str, Pod] = {}
        # Recently deleted uids: a wait_ready that starts after the DELETED event still fails
        # at once instead of waiting out its budget. Bounded, oldest first out.
        self._deleted: OrderedDict[str, None] = OrderedDict()
        # Creates this provider saw stored (name -> uid, when, version) and the last list
        # (when it started, its version): together they tell "deleted before we ever saw it".
        self._stored: dict[str, tuple[str, float, str]] = {}
        self._listed: tuple[float, str] | None = None
        self._waiters: dict[str, list[Waiter]] = {}
        self._pending: dict[str, PendingDelete] = {}
        self._owners: dict[int, asyncio.Future[OwnerRef]] = {}  # job id -> pods' owner
        self._tasks: set[asyncio.Task[Any]] = set()
        self._retrier: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Any = None, **kwargs: Any) -> KubernetesProvider:
        """Build from Django settings (``SANDMAN_NAMESPACE``, ``SANDMAN_KUBECONFIG``, and the
        optional ``SANDMAN_EXECD_*`` / ``SANDMAN_K8S_*`` values below, defaults if unset)."""
        if settings is None:
            from django.conf import settings

        def get(name: str, default: Any) -> Any:
            value = getattr(settings, name, None)
            return default if value is None or value == "" else value

        defaults = KubernetesConfig()
        config = KubernetesConfig(
            namespace=get("SANDMAN_NAMESPACE", defaults.namespace),
            kubeconfig=get("SANDMAN_KUBECONFIG", None),
            execd_port=int(get("SANDMAN_EXECD_PORT", defaults.execd_port)),
            carrier_image=get("SANDMAN_EXECD_CARRIER_IMAGE", defaults.carrier_image),
            workspace=get("SANDMAN_K8S_WORKSPACE", defaults.workspace),
            max_workers=int(get("SANDMAN_K8S_WORKERS", defaults.max_workers)),
            request_timeout_s=float(
                get("SANDMAN_K8S_REQUEST_TIMEOUT_S", defaults.request_timeout_s)
            ),
            watch_timeout_s=int(get("SANDMAN_K8S_WATCH_TIMEOUT_S", defaults.watch_timeout_s)),
            verify_health=bool(get("SANDMAN_K8S_VERIFY_HEALTH", defaults.verify_health)),
            drop_all_capabilities=bool(
                get("SANDMAN_K8S_DROP_ALL_CAPABILITIES", defaults.drop_all_capabilities)
            ),
        )
        return cls(config, **kwargs)

    # --- plumbing ---------------------------------------------------------------------------
    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise ProviderError("the kubernetes provider is closed")
        if self._loop is None:
            self._loop = loop
            self.informer = PodInformer(self.core, self.config, loop, self._on_sync, self._on_event)
            self.informer.start()
        return loop

    def _submit(
        self, op: str, name: str, fn: Callable[..., T], *args: Any
    ) -> concurrent.futures.Future[T]:
        hook = self.work_item_hook

        def item() -> T:
            if hook is not None:
                hook(op, name)  # a test gate may hold the item here, before any request
            return fn(*args)

        return self._executor.submit(item)

    async def _in_thread(self, op: str, name: str, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking client call; a cancelled caller does not stop the call."""
        answer = asyncio.wrap_future(self._submit(op, name, fn, *args))
        # If the caller is gone, nobody reads the outcome: mark it read (the caller's own
        # cancellation path has already put the pod in the pending set).
        answer.add_done_callback(lambda f: f.cancelled() or f.exception())
        return await asyncio.shield(answer)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _hook(self, fn: Callable[..., None] | None, *args: Any) -> None:
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:  # a broken hook must not lose the pod: it stays in our set
            log.exception("kubernetes provider hook %s failed", fn)

    async def list_owned(self) -> list[OwnedSandbox]:
        self._ensure_started()
        try:
            pods = await self._in_thread(
                "list",
                "",
                lambda: self.core.list_namespaced_pod(
                    self.config.namespace,
                    label_selector=SELECTOR,
                    _request_timeout=self.config.request_timeout_s,
                ),
            )
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise ProviderError(f"listing Sandman's pods failed: {describe(exc)}") from exc
        owned = []
        for pod in pods.items:
            meta, labels = pod.metadata, pod.metadata.labels or {}
            job = labels.get(L.JOB, "")
            owned.append(
                OwnedSandbox(
                    name=meta.name,
                    uid=meta.uid,
                    nonce=(meta.annotations or {}).get(L.NONCE_ANNOTATION, ""),
                    job_id=int(job) if job.isdigit() else None,
                    role=labels.get(L.ROLE, ""),
                    phase=pod.status.phase if pod.status else "",
                    created=meta.creation_timestamp,
                )
            )
        return owned

    # --- shutdown ---------------------------------------------------------------------------
    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._retrier is not None:
            self._retrier.cancel()
        settling = [t for t in self._tasks if t is not self._retrier]
        if settling:  # abandoned creates still own pods: let them finish their delete
            await asyncio.wait(settling, timeout=self.config.request_timeout_s * 2)
        if self.informer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.informer.stop)
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(
                        SandboxNotReady("the provider closed", {"name": waiter.name})
                    )
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)
        if self._http is not None:
            await self._http.close()
        if self._owns_client:
            self.api_client.close()
