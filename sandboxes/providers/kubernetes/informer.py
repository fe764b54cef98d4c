"""Kubernetes backend: readiness facts from raw pod JSON and the pod informer.

Readiness comes from ONE list+watch of Sandman's pods in the namespace (an informer-style
cache), never from one poll loop per pod. :func:`pod_informer` builds it on the shared
:class:`~sandboxes.providers.kubernetes.reflector.Reflector` (paged list, resume from the
last ``resourceVersion``, one reconnect per watch expiry, relist only on 410), the same
machinery the Events informer uses.

Events stay raw JSON (building a client model per event costs ~15x the parse). The address
in :func:`ready_info` is ``podIP:port`` -- never a Service -- with the configured execd
port, the one the pod's container port and readiness probe name.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

from kubernetes import client

from sandboxes import labels as L
from sandboxes.providers.base import ReadyInfo
from sandboxes.providers.kubernetes.config import KubernetesConfig
from sandboxes.providers.kubernetes.paging import pod_list_call
from sandboxes.providers.kubernetes.reflector import OnEvent, OnSync, Reflector

# --- readiness facts from a pod (raw JSON: the informer never builds models) ---------------
Pod = dict[str, Any]


def _parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def pod_meta(pod: Pod) -> dict[str, Any]:
    return pod.get("metadata") or {}


def pod_status(pod: Pod) -> dict[str, Any]:
    return pod.get("status") or {}


def _condition_time(pod: Pod, ctype: str) -> dt.datetime | None:
    for cond in pod_status(pod).get("conditions") or []:
        if cond.get("type") == ctype and cond.get("status") == "True":
            return _parse_time(cond.get("lastTransitionTime"))
    return None


def pod_is_ready(pod: Pod) -> bool:
    return bool(pod_status(pod).get("podIP")) and _condition_time(pod, "Ready") is not None


def pod_failure(pod: Pod) -> str | None:
    """Why this pod can never become Ready, or None."""
    if pod_meta(pod).get("deletionTimestamp"):
        return "terminating"
    phase = pod_status(pod).get("phase")
    if phase in ("Failed", "Succeeded"):
        message = (pod_status(pod).get("message") or "").strip()
        return f"phase {phase}: {message}" if message else f"phase {phase}"
    return None


def _guards(pod: Pod) -> dict[str, object]:
    spec = pod.get("spec") or {}
    containers = spec.get("containers") or [{}]
    main = next((c for c in containers if c.get("name") == "sandbox"), containers[0])
    sc = main.get("securityContext") or {}
    return {
        "seccomp": ((spec.get("securityContext") or {}).get("seccompProfile") or {}).get("type"),
        "capabilities_dropped": list((sc.get("capabilities") or {}).get("drop") or []),
        "no_privilege_escalation": sc.get("allowPrivilegeEscalation") is False,
        "service_account_token": bool(spec.get("automountServiceAccountToken")),
        "egress": (pod_meta(pod).get("labels") or {}).get(L.EGRESS, ""),
    }


def ready_info(pod: Pod, config: KubernetesConfig) -> ReadyInfo:
    """What a Ready pod itself tells: podIP:port, node, guards and the times in its status
    (whole seconds). Pulls, address failures and the finer timeline come from core/v1
    Events (``events.EventFacts.join``); here they are unknown (None)."""
    ip = pod_status(pod).get("podIP") or ""
    port = config.execd_port
    started = None
    for cs in pod_status(pod).get("containerStatuses") or []:
        if cs.get("name") == "sandbox":
            started = _parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
    candidates = {
        "api_created": _parse_time(pod_meta(pod).get("creationTimestamp")),
        "scheduled": _condition_time(pod, "PodScheduled"),
        "started": started,
        "ready": _condition_time(pod, "Ready"),
    }
    return ReadyInfo(
        address=f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}",
        node=(pod.get("spec") or {}).get("nodeName") or "",
        guards=_guards(pod),
        timeline={k: v for k, v in candidates.items() if v is not None},
        image_present=None,
        pull_ms=None,
        address_failures=None,
    )


# --- the informer: one list+watch of Sandman's pods (reflector.py) ------------------------
def pod_informer(
    core: client.CoreV1Api,
    config: KubernetesConfig,
    loop: asyncio.AbstractEventLoop,
    on_sync: OnSync,
    on_event: OnEvent,
) -> Reflector:
    """The one list+watch of Sandman's pods in the namespace (not started)."""
    return Reflector(
        pod_list_call(core, config), config, loop, on_sync, on_event, name="pod-informer"
    )
