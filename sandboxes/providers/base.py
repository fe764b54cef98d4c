"""The provider contract: what the pool may ask of a backend, and what it gets back.

Every backend (``local``, ``kubernetes``) implements :class:`Provider`. Above this line
nothing sees a raw Kubernetes object or a process handle: only these frozen dataclasses.

Ordering rules a backend must keep (paper §4.4, Appendix F):
* ``create`` runs to settlement. Once the request may have reached the backend, the
  caller's cancellation must not abandon it: the backend either returns a ``Handle`` or
  raises with the pod's identity (``ProviderError.extra["name"]``) after making sure the
  pod is gone or recorded for deletion. The pool shields ``create`` from cancellation.
* After an ambiguous answer (5xx, connection reset) ``create`` reads the pod back by its
  pre-assigned name and deletes it only if it carries this spec's nonce. A 409 for a pod
  without our nonce is ``ProviderConflict`` and the pod is left alone.
* ``destroy`` is idempotent: "already gone" is success. A failure raises; the caller
  keeps the handle in its pending-delete set and retries.
* The protocol declares EVERYTHING the controller calls. A backend without owners or
  anchors (``local``) implements those methods as no-ops; nobody probes with ``getattr``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class OwnerRef:
    """Who garbage-collects the pod if Sandman is gone: the trainer pod or a job anchor."""

    kind: str
    name: str
    uid: str
    api_version: str = "v1"


@dataclass(frozen=True)
class SandboxSpec:
    """Everything a backend needs to create one sandbox. ``name`` is pre-assigned."""

    name: str
    nonce: str
    token: str
    job_id: int
    role: str  # "rollout" | "grading"
    image: str
    base_commit: str | None
    cpu_millis: int
    memory_bytes: int
    workspace_bytes: int | None
    egress: str  # "deny" | "allow"
    key_hash: str
    owner: OwnerRef | None = None
    # Extra labels a backend should attach (already includes none of labels.py's keys).
    labels: tuple[tuple[str, str], ...] = ()
    # The job's execd key (``token`` is HMAC-SHA256(key, name)); a Kubernetes pod derives
    # its token from it. Never printed (repr=False), never in a pod object.
    execd_key: str = field(default="", repr=False)
    # Placement (sandboxes.placement, checked at job create): the job's node pool (empty:
    # the backend's default) and other node labels. Backends without nodes ignore both.
    node_pool: str = ""
    node_selector: tuple[tuple[str, str], ...] = ()
    # The job's startup script: execd runs it first in every session's shell (empty: none).
    startup_script: str = ""


@dataclass(frozen=True)
class Handle:
    """A create the backend accepted. ``uid`` is the backend's identity when it has one."""

    name: str
    nonce: str
    backend: str
    uid: str = ""
    # Backend-private locator (a pid, a workspace path); opaque to the pool.
    ref: str = ""


@dataclass(frozen=True)
class ReadyInfo:
    """What the backend learned while the sandbox became Ready.

    ``address`` is ``host:port`` of execd: the pod IP, never a Service.
    ``timeline`` maps event names of docs/architecture.md §8 (``api_created``, ``scheduled``,
    ``address_assigned``, ``image_pulled``, ``started``, ``ready``) to tz-aware UTC times.
    """

    address: str
    node: str = ""
    guards: dict[str, object] = field(default_factory=dict)
    timeline: dict[str, dt.datetime] = field(default_factory=dict)
    image_present: bool | None = None
    pull_ms: float | None = None
    # None: unknown (no Event told, e.g. expired or dropped) -- never counted as 0.
    address_failures: int | None = 0


@dataclass(frozen=True)
class LostSandbox:
    """A sandbox that was Ready and no longer is: evicted, its node lost, Ready False."""

    name: str
    uid: str
    reason: str  # "Evicted", "NotReady", ...: the backend's own word
    message: str


@dataclass(frozen=True)
class OwnedSandbox:
    """A sandbox the backend holds that carries Sandman's managed-by label."""

    name: str
    uid: str
    nonce: str
    job_id: int | None
    role: str
    phase: str
    created: dt.datetime | None = None
    terminating: bool = False  # deleted, not gone yet (Kubernetes: deletionTimestamp set)


@runtime_checkable
class Provider(Protocol):
    name: str

    async def create(self, spec: SandboxSpec) -> Handle:
        """Create the sandbox; return once the backend has stored it (not once Ready)."""
        ...

    async def wait_ready(self, handle: Handle, budget_s: float) -> ReadyInfo:
        """Wait until execd answers health, or raise ``SandboxNotReady`` after budget_s."""
        ...

    async def health(self, handle: Handle, address: str, token: str) -> bool:
        """One execd health check at ``address``; False on any failure."""
        ...

    async def destroy(self, handle: Handle) -> None:
        """Delete the sandbox until confirmed gone. Idempotent."""
        ...

    async def list_owned(self) -> list[OwnedSandbox]:
        """Every sandbox carrying Sandman's managed-by label, whoever created it."""
        ...

    async def close(self) -> None:
        """Release clients, threads and child processes."""
        ...

    async def owner_for(self, job_id: int, trainer: OwnerRef | None) -> OwnerRef | None:
        """The owner a create of this job names: ``trainer`` when the backend can use it,
        else the job's anchor (created on first use); a backend without owners returns
        ``trainer`` and ignores it."""
        ...

    async def delete_anchor(self, job_id: int) -> None:
        """Delete the drained job's anchor, if it has one; raise ``ProviderError`` to retry."""
        ...

    async def list_anchors(self) -> list[int]:
        """The job ids of every anchor the backend holds (none without anchors)."""
        ...

    async def flush_pending(self) -> int:
        """Try every delete the backend itself still holds pending, now; how many confirmed."""
        ...

    def check_image(self, image: str, base_commit: str | None) -> bool | None:
        """Judge an image before anything is created (cheap, synchronous, no loop needed).

        True: known good; False: unknown image (the API answers ``unknown_image``);
        None: the backend cannot tell before a pull.
        """
        ...

    def take_lost(self) -> list[LostSandbox]:
        """Sandboxes that were Ready and are no longer (evicted, node lost, Ready turned
        False) since the last call, each reported once; [] on a backend that cannot lose
        a Ready sandbox behind its holder's back."""
        ...

    def listen_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (on the provider's loop) whenever ``take_lost`` has something
        new; a backend that never reports losses never calls it."""
        ...

    def lost_now(self, name: str, uid: str) -> LostSandbox | None:
        """Whether the backend sees this sandbox (``uid``, when known) lost right now, as
        ``take_lost`` will report it; None when it does not (or cannot tell). Does not
        consume the report: asked before a warm hand-out."""
        ...
