"""Kubernetes backend: which stuck pods are final, and why a pod waits to be scheduled.

Decisions (docs/architecture.md §3.2) a reader must not change without the tests:
* Final -- the pod fails its readiness wait at once: a container or init container
  waiting in ``ImagePullBackOff`` (the kubelet's back-off says the pull failed: a bad task
  image, or a carrier image it cannot fetch), ``InvalidImageName`` or
  ``ErrImageNeverPull``. A first ``ErrImagePull`` is not final (a retry may succeed);
  the back-off that follows it is.
* Lost -- a pod that was Ready and then is Failed (``status.reason``, e.g. Evicted) or
  Ready False (a lost node, a failing readiness probe) is reported once as
  :class:`LostSandbox`; the owner decides (the controller fails and deletes it).
* Wait-and-see -- ``PodScheduled`` False with reason ``Unschedulable`` (capacity may
  free) or ``SchedulingGated`` (a webhook's gate may be lifted): the readiness budget
  runs, and when it ends its error names that reason and the scheduler's message.
Raw pod JSON only, like the informer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FINAL_WAITING = frozenset({"ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"})


@dataclass(frozen=True)
class Stuck:
    reason: str
    container: str
    init: bool
    message: str


def final_waiting(pod: dict[str, Any]) -> Stuck | None:
    """The first container (init containers first) stuck in a final waiting reason."""
    status = pod.get("status") or {}
    for key, init in (("initContainerStatuses", True), ("containerStatuses", False)):
        for cs in status.get(key) or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in FINAL_WAITING:
                return Stuck(
                    waiting["reason"], cs.get("name", ""), init, waiting.get("message", "")
                )
    return None


def scheduling_wait(pod: dict[str, Any] | None) -> tuple[str, str] | None:
    """(reason, message) of a ``PodScheduled`` False condition, or None."""
    for cond in ((pod or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return cond.get("reason") or "Unscheduled", cond.get("message") or ""
    return None


def lost_reason(pod: dict[str, Any]) -> tuple[str, str] | None:
    """(reason, message) if a pod that was Ready is now Failed or not Ready, else None."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Failed", "Succeeded"):
        return status.get("reason") or status["phase"], status.get("message") or ""
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") != "True":
            return "NotReady", cond.get("message") or "the pod's Ready condition is no longer True"
    return None
