"""``KubernetesProvider``: a thin facade over the collaborators of the Kubernetes backend.

The facade builds each collaborator once, handing it in its constructor only what it
uses, and forwards the ``Provider`` calls to them:

* ``calls.ApiCalls`` -- the executor every blocking client call runs on;
* ``readiness.ReadinessTracker`` -- the informer's cache, waiters, ``wait_ready``;
* ``events.EventFacts`` / ``events.event_informer`` -- the namespace's core/v1 Events (one
  list+watch) read into pulls, address failures and the timeline of each pod;
* ``creator.PodCreator`` -- ``create``: nonce, read-back after ambiguous answers, 409 rules;
* ``deleter.PodDeleter`` -- ``destroy`` and the pending set;
* ``terminating.GoneTracker`` -- which pods are Terminating or gone (confirms deletes);
* ``late.LateCreates`` -- creates found absent that may still land (deleted when they do);
* ``anchors.Anchors`` -- owners of a job's pods and the per-job anchor;
* ``jobsecrets.JobSecrets`` -- the per-job Secret with the execd key (ensured before a create);
* ``listing.PodLister`` -- ``list_owned`` (paged, ``paging.pod_pages``);
* ``retry.RetryPolicy`` -- which refusals are sent again (429, exceeded quota) and when;
* ``health.ExecdHealth`` -- the one place this backend calls execd.

Ownership rules a reader must not break (paper §4.4, Appendix F; ``base.py``):

* A create runs to settlement even if the awaiting task is cancelled; whatever it stored
  is handed back, or deleted, or held in the pending set until a delete is confirmed.
* After a 5xx or a transport error the pod is read back by name and deleted (UID
  precondition) only if it carries this create's nonce. A 4xx sends no read and no
  delete; a 409 for a pod without our nonce is ``ProviderConflict`` and it is left alone.
* ``destroy`` is idempotent; an unconfirmed delete stays pending until confirmed, and a
  delete is confirmed only when the pod is gone (DELETED or 404), never at a 2xx.
* The informer starts on the first call that needs the cluster and serves only the event
  loop of that call; once closed, every such call raises ``ProviderError``. ``sleep`` is
  the only clock of backoffs and readiness budgets.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from kubernetes import client

from sandboxes.providers.base import (
    Handle,
    LostSandbox,
    OwnedSandbox,
    OwnerRef,
    ReadyInfo,
    SandboxSpec,
)
from sandboxes.providers.kubernetes.anchors import Anchors, anchor_name
from sandboxes.providers.kubernetes.calls import ApiCalls, Background, WorkItemHook
from sandboxes.providers.kubernetes.config import (
    KubernetesConfig,
    build_api_client,
    config_from_settings,
)
from sandboxes.providers.kubernetes.creator import PodCreator
from sandboxes.providers.kubernetes.deleter import DeleteHooks, PendingDelete, PodDeleter
from sandboxes.providers.kubernetes.events import EventFacts, event_informer
from sandboxes.providers.kubernetes.health import ExecdHealth
from sandboxes.providers.kubernetes.informer import pod_informer
from sandboxes.providers.kubernetes.jobsecrets import JobSecrets
from sandboxes.providers.kubernetes.late import LateCreates
from sandboxes.providers.kubernetes.listing import PodLister
from sandboxes.providers.kubernetes.readiness import ReadinessTracker
from sandboxes.providers.kubernetes.reflector import Reflector
from sandboxes.providers.kubernetes.retry import RetryPolicy
from sandboxes.providers.kubernetes.terminating import GoneTracker
from sandman_site.errors import ProviderError

log = logging.getLogger(__name__)


class KubernetesProvider:
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
        work_item_hook: WorkItemHook | None = None,
    ) -> None:
        self.config = cfg = config or KubernetesConfig()
        self._owns_client = api_client is None
        self.api_client = api_client or build_api_client(cfg)
        self.core = core = client.CoreV1Api(self.api_client)
        backoff = backoff or (lambda n: min(cfg.backoff_max_s, cfg.backoff_initial_s * 2**n))
        self.informer: Reflector | None = None
        self.event_informer: Reflector | None = None
        self._event_facts = EventFacts()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        start = self._ensure_started

        self._calls = calls = ApiCalls(cfg.max_workers, work_item_hook)
        self._background = background = Background()
        self._health = ExecdHealth(cfg.health_timeout_s, work_item_hook)
        self._readiness = ReadinessTracker(
            cfg,
            ensure_started=start,
            health=self._health.check,
            sleep=sleep,
            events=self._event_facts,
        )
        hooks = DeleteHooks(on_pending, on_deleted)
        self._gone = GoneTracker(on_gone=lambda *pod: self._deleter.note_gone(*pod))
        self._late = LateCreates(cfg, on_landed=self._late_landed)
        self._deleter = PodDeleter(
            core,
            cfg,
            calls=calls,
            background=background,
            hooks=hooks,
            ensure_started=start,
            forget_stored=self._readiness.forget_stored,
            sleep=sleep,
            backoff=backoff,
            is_terminating=self._gone.terminating,
            was_gone=self._gone.was_gone,
        )
        retry = RetryPolicy(cfg, backoff)
        self._creator = PodCreator(
            core,
            cfg,
            backend=self.name,
            calls=calls,
            background=background,
            deleter=self._deleter,
            hooks=hooks,
            ensure_started=start,
            note_stored=self._readiness.note_stored,
            retry=retry,
            sleep=sleep,
            expect_late=self._late.expect,
        )
        self._anchors = Anchors(
            core, cfg, calls=calls, ensure_started=start, sleep=sleep, backoff=backoff
        )
        self._secrets = JobSecrets(
            core,
            cfg,
            calls=calls,
            ensure_started=start,
            sleep=sleep,
            backoff=backoff,
            retry=retry,
        )
        self._lister = PodLister(core, cfg, calls=calls, ensure_started=start)

    @classmethod
    def from_settings(cls, settings: Any = None, **kwargs: Any) -> KubernetesProvider:
        """Build from Django settings (``SANDMAN_NAMESPACE``, ``SANDMAN_KUBECONFIG``, and the
        optional ``SANDMAN_EXECD_*`` / ``SANDMAN_K8S_*`` values, defaults if unset)."""
        if settings is None:
            from django.conf import settings  # Django only when asked to read its settings
        return cls(config_from_settings(settings), **kwargs)

    def api_call_ms(self) -> dict[str, list[float]]:
        """The last client calls' durations in ms, per operation (create, delete, list...)."""
        return {op: list(d) for op, d in self._calls.durations.items()}

    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise ProviderError("the kubernetes provider is closed")
        if self._loop is None:
            self._loop = loop
            followers = (self._readiness, self._gone, self._late)

            def on_sync(pods: list[Any], started: float, version: str) -> None:
                for follower in followers:
                    follower.on_sync(pods, started, version)

            def on_event(kind: str, pod: Any) -> None:
                for follower in followers:
                    follower.on_event(kind, pod)

            self.informer = pod_informer(self.core, self.config, loop, on_sync, on_event)
            self.informer.start()
            facts = self._event_facts
            self.event_informer = event_informer(
                self.core, self.config, loop, facts.on_sync, facts.on_event
            )
            self.event_informer.start()
        return loop

    def _late_landed(self, name: str, uid: str, nonce: str) -> None:
        """A create found absent landed after all: own it (pending) and delete it."""
        if self._closed:
            return
        self._deleter.add_pending(PendingDelete(name, uid, nonce))
        self._background.spawn(self._delete_late(Handle(name, nonce, self.name, uid=uid)))

    async def _delete_late(self, handle: Handle) -> None:
        try:
            await self._deleter.destroy(handle)
        except ProviderError:
            log.warning("late-landing pod %s stays pending deletion", handle.name, exc_info=True)

    # --- the Provider protocol ----------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> Handle:
        # The job's key Secret first: a pod that mounts a missing Secret cannot start.
        await self._secrets.ensure(spec.job_id, spec.execd_key, spec.owner)
        return await self._creator.create(spec)

    async def wait_ready(self, handle: Handle, budget_s: float) -> ReadyInfo:
        return await self._readiness.wait_ready(handle, budget_s)

    async def health(self, handle: Handle, address: str, token: str) -> bool:
        return await self._health.check(handle.name, address, token)

    async def destroy(self, handle: Handle) -> None:
        await self._deleter.destroy(handle)

    async def list_owned(self) -> list[OwnedSandbox]:
        return await self._lister.list_owned()

    def take_lost(self) -> list[LostSandbox]:
        """Pods that were Ready and since failed or turned not Ready (evicted, node lost,
        readiness probe failing), each once; the controller fails and deletes them."""
        return self._readiness.take_lost()

    def listen_lost(self, callback: Callable[[], None]) -> None:
        """``callback()`` on the provider's loop each time the pod watch shows a Ready pod
        lost, so the owner takes it (``take_lost``) at once rather than at its next round."""
        self._readiness.on_lost = callback

    def lost_now(self, name: str, uid: str) -> LostSandbox | None:
        """The pod as the pod watch last delivered it is Failed or not Ready (execd may
        still answer: a failing readiness probe, a node that stopped reporting)."""
        return self._readiness.lost_now(name, uid)

    def check_image(self, image: str, base_commit: str | None) -> bool | None:
        """No answer before a create: a cluster learns of a bad image at pull time."""
        return None

    # --- owners and anchors -----------------------------------------------------------------
    async def owner_for(self, job_id: int, trainer: OwnerRef | None) -> OwnerRef | None:
        """The owner the job's pods name: ``trainer`` if that pod lives in the sandbox
        namespace with that uid, else the job's anchor (created now if needed)."""
        return await self._anchors.owner_for(job_id, trainer)

    async def ensure_anchor(self, job_id: int) -> OwnerRef:
        return await self._anchors.ensure_anchor(job_id)

    async def list_anchors(self) -> list[int]:
        """Jobs with an anchor or a key Secret here (the sweep deletes the stale ones)."""
        anchors = await self._anchors.list_anchors()
        return sorted(set(anchors) | set(await self._secrets.list_jobs()))

    async def delete_anchor(self, job_id: int) -> None:
        """Delete the job's anchor and its key Secret (each: gone already counts)."""
        await self._anchors.delete_anchor(job_id)
        await self._secrets.delete(job_id)

    @staticmethod
    def anchor_name(job_id: int) -> str:
        return anchor_name(job_id)

    # --- pending deletes ----------------------------------------------------------------------
    def pending_deletes(self) -> list[PendingDelete]:
        return self._deleter.pending_deletes()

    def add_pending(self, name: str, uid: str, nonce: str) -> None:
        """Adopt a pending delete recorded elsewhere (the pool's table after a restart)."""
        self._deleter.adopt(name, uid, nonce)

    async def flush_pending(self) -> int:
        """Try every pending delete once; returns how many were confirmed."""
        return await self._deleter.flush_pending()

    # --- shutdown -----------------------------------------------------------------------------
    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        retrier = self._deleter.stop()
        settling = [t for t in self._background.running() if t is not retrier]
        if settling:  # abandoned creates still own pods: let them finish their delete
            await asyncio.wait(settling, timeout=self.config.request_timeout_s * 2)
        loop = asyncio.get_running_loop()
        if self.informer is not None:
            await loop.run_in_executor(None, self.informer.stop)
        if self.event_informer is not None:
            await loop.run_in_executor(None, self.event_informer.stop)
        self._readiness.close()
        await loop.run_in_executor(None, self._calls.shutdown)
        await self._health.close()
        if self._owns_client:
            self.api_client.close()
