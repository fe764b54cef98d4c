"""Pod status as the API server and kubelet write it: defaults, conditions, container states.

Pure functions on pod dicts. Conditions change ``lastTransitionTime`` only when their
status flips, as in Kubernetes; container statuses are rebuilt from the spec each time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

Obj = dict[str, Any]


def prepare_pod(body: Obj) -> Obj:
    """Server-side defaults for a new pod: Pending status and its QoS class."""
    spec = body.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    resources = [c.get("resources") or {} for c in spec.get("containers") or []]
    qos = "BestEffort"
    if any(r.get("requests") or r.get("limits") for r in resources):
        guaranteed = all(
            {"cpu", "memory"} <= set(r.get("limits") or {})
            and all(r["limits"].get(k) == v for k, v in (r.get("requests") or {}).items())
            for r in resources
        )
        qos = "Guaranteed" if guaranteed else "Burstable"
    body["status"] = {"phase": "Pending", "qosClass": qos}
    return body


def annotations_of(obj: Obj) -> dict[str, str]:
    """The object's annotations dict, created if absent or null."""
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta.get("annotations"), dict):
        meta["annotations"] = {}
    return meta["annotations"]


def main_container(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The task container: the one named ``sandbox``, else the first."""
    containers = pod.get("spec", {}).get("containers") or [{}]
    return next((c for c in containers if c.get("name") == "sandbox"), containers[0])


def set_condition(
    status: Obj, ctype: str, value: bool, when: str, reason: str | None = None
) -> None:
    text = "True" if value else "False"
    conds = status.setdefault("conditions", [])
    for cond in conds:
        if cond["type"] == ctype:
            if cond["status"] != text:
                cond.update(status=text, lastTransitionTime=when)
            if reason:
                cond["reason"] = reason
            else:
                cond.pop("reason", None)
            return
    cond = {"type": ctype, "status": text, "lastProbeTime": None, "lastTransitionTime": when}
    if reason:
        cond["reason"] = reason
    conds.append(cond)


def image_id(image: str) -> str:
    return "sha256:" + hashlib.sha256(image.encode()).hexdigest() if image else ""


def _container_status(c: Mapping[str, Any], *, ready: bool, started: bool, state: Obj) -> Obj:
    image = c.get("image", "")
    return {
        "name": c["name"],
        "image": image,
        "imageID": image_id(image),
        "ready": ready,
        "restartCount": 0,
        "started": started,
        "state": state,
    }


def mark_running(p: Obj, when: str) -> None:
    """Init containers completed, every container running, not yet Ready."""
    st = p["status"]
    st["phase"] = "Running"
    set_condition(st, "Initialized", True, when)
    set_condition(st, "ContainersReady", False, when, "ContainersNotReady")
    set_condition(st, "Ready", False, when, "ContainersNotReady")
    done = {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": when}}
    st["initContainerStatuses"] = [
        _container_status(c, ready=True, started=False, state=done)
        for c in p["spec"].get("initContainers") or []
    ]
    st["containerStatuses"] = [
        _container_status(c, ready=False, started=True, state={"running": {"startedAt": when}})
        for c in p["spec"].get("containers") or []
    ]


def mark_ready(p: Obj, when: str) -> None:
    st = p["status"]
    set_condition(st, "ContainersReady", True, when)
    set_condition(st, "Ready", True, when)
    for cs in st.get("containerStatuses") or []:
        cs["ready"] = True


def mark_failed(p: Obj, when: str, reason: str, message: str) -> None:
    st = p["status"]
    st["phase"] = "Failed"
    st["message"] = message
    set_condition(st, "ContainersReady", False, when, "PodFailed")
    set_condition(st, "Ready", False, when, "PodFailed")
    state = {
        "terminated": {"exitCode": 1, "reason": reason, "message": message, "finishedAt": when}
    }
    st["containerStatuses"] = [
        _container_status(c, ready=False, started=False, state=state)
        for c in p["spec"].get("containers") or []
    ]
