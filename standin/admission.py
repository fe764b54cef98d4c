"""What the stand-in's API server checks before it stores a pod, and how it says no.

Imitates, in the order kube-apiserver runs them (Kubernetes docs, "Admission Control in
Kubernetes", https://kubernetes.io/docs/reference/access-authn-authz/admission-controllers/):

* load shedding first -- API Priority and Fairness rejects a request before any handler
  reads it: 429 ``TooManyRequests`` with a ``Retry-After`` header ("API Priority and
  Fairness", https://kubernetes.io/docs/concepts/cluster-administration/flow-control/);
* object validation: a pod name is a DNS-1123 subdomain, label values are valid label
  values, ``spec.containers`` and each container's ``name`` and ``image`` are required
  (an image with leading or trailing whitespace is invalid);
  a failure is 422 ``Invalid`` with one ``details.causes`` entry per field ("Object Names
  and IDs", https://kubernetes.io/docs/concepts/overview/working-with-objects/names/);
* the ResourceQuota admission plugin: a pod-count / ``requests.cpu`` limit per namespace,
  403 ``Forbidden`` with the API server's ``exceeded quota`` message ("Resource Quotas",
  https://kubernetes.io/docs/concepts/policy/resource-quotas/);
* a validating webhook that timed out (``failurePolicy: Fail``): 500 ``InternalError``
  ``failed calling webhook ... context deadline exceeded`` ("Dynamic Admission Control",
  https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/).

Rule a reader must not break: every check here runs BEFORE the store changes, so a request
refused here stored nothing (what makes a 429 create safe to resend), and each answer is a
``Status`` body whose ``code`` is the HTTP status.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from standin.status import status_body

DNS1123_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
SUBDOMAIN_MSG = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, "
    "'-' or '.', and must start and end with an alphanumeric character (e.g. "
    f"'example.com', regex used for validation is '{DNS1123_SUBDOMAIN}')"
)
LABEL_NAME_MSG = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
    "and must start and end with an alphanumeric character (e.g. 'my-name',  or "
    f"'123-abc', regex used for validation is '{DNS1123_LABEL}')"
)
LABEL_VALUE_MSG = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' "
    "or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    f"'my_value',  or '12345', regex used for validation is '{LABEL_VALUE}')"
)
THROTTLED_MSG = "Too many requests, please try again later."


@dataclass(frozen=True)
class Cause:
    field: str
    reason: str  # FieldValueRequired | FieldValueInvalid | FieldValueTooLong
    message: str

    def text(self) -> str:
        return f"{self.field}: {self.message}"


def _invalid(field: str, value: str, why: str) -> Cause:
    return Cause(field, "FieldValueInvalid", f'Invalid value: "{value}": {why}')


def _required(field: str) -> Cause:
    return Cause(field, "FieldValueRequired", "Required value")


def _name_causes(name: str) -> list[Cause]:
    if len(name) > 253:
        return [_invalid("metadata.name", name, "must be no more than 253 characters")]
    if name and not re.fullmatch(DNS1123_SUBDOMAIN, name):
        return [_invalid("metadata.name", name, SUBDOMAIN_MSG)]
    return []


def _label_causes(labels: Any) -> list[Cause]:
    causes = []
    for value in (labels or {}).values() if isinstance(labels, dict) else []:
        text = str(value)
        if len(text) > 63:
            causes.append(_invalid("metadata.labels", text, "must be no more than 63 characters"))
        elif not re.fullmatch(LABEL_VALUE, text):
            causes.append(_invalid("metadata.labels", text, LABEL_VALUE_MSG))
    return causes


def _container_causes(spec: Any) -> list[Cause]:
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not containers:
        return [_required("spec.containers")]
    causes = []
    for i, container in enumerate(containers):
        where = f"spec.containers[{i}]"
        name = (container or {}).get("name") or ""
        if not name:
            causes.append(_required(f"{where}.name"))
        elif not re.fullmatch(DNS1123_LABEL, name) or len(name) > 63:
            causes.append(_invalid(f"{where}.name", name, LABEL_NAME_MSG))
        image = str((container or {}).get("image") or "")
        if not image:
            causes.append(_required(f"{where}.image"))
        elif image != image.strip():
            why = "must not have leading or trailing whitespace"
            causes.append(_invalid(f"{where}.image", image, why))
    return causes


def validate_pod(body: dict[str, Any]) -> list[Cause]:
    """Every field of a pod create the API server's validation would reject."""
    meta = body.get("metadata") or {}
    return [
        *_name_causes(meta.get("name") or ""),
        *_label_causes(meta.get("labels")),
        *_container_causes(body.get("spec")),
    ]


def invalid_response(kind: str, name: str, causes: Iterable[Cause]) -> web.Response:
    """422 ``Invalid``: ``Pod "x" is invalid: <field>: <why>`` with ``details.causes``."""
    causes = list(causes)
    texts = [c.text() for c in causes]
    joined = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
    body = status_body(422, f'{kind} "{name}" is invalid: {joined}', name=name, kind=kind)
    body["details"]["causes"] = [
        {"reason": c.reason, "message": c.message, "field": c.field} for c in causes
    ]
    return web.json_response(body, status=422)


def throttled_response(retry_after_s: int) -> web.Response:
    """429 as APF answers: ``Retry-After`` header; the Status names the seconds too."""
    body = status_body(429, THROTTLED_MSG, reason="TooManyRequests")
    body["details"] = {"retryAfterSeconds": retry_after_s}
    return web.json_response(body, status=429, headers={"Retry-After": str(retry_after_s)})


def webhook_timeout_response(webhook: str = "policy.sandman.invalid") -> web.Response:
    """A ``failurePolicy: Fail`` validating webhook that did not answer in its timeout."""
    message = (
        f'Internal error occurred: failed calling webhook "{webhook}": failed to call '
        f'webhook: Post "https://{webhook}:443/validate?timeout=10s": context deadline exceeded'
    )
    return web.json_response(status_body(500, message, reason="InternalError"), status=500)


def dry_run_object(body: dict[str, Any], namespace: str) -> dict[str, Any]:
    """What ``dryRun=All`` answers: the object as it would be stored, nothing stored.

    ("Kubernetes API Concepts -- Dry-run",
    https://kubernetes.io/docs/reference/using-api/api-concepts/#dry-run): validation and
    admission ran; no version was used up, so ``resourceVersion`` stays empty.
    """
    obj = json.loads(json.dumps(body))
    meta = obj.setdefault("metadata", {})
    meta["namespace"] = namespace
    meta.setdefault("name", (meta.get("generateName") or "") + "dryrun")
    meta["uid"] = str(uuid.uuid4())
    meta.pop("resourceVersion", None)
    obj["kind"], obj["apiVersion"] = "Pod", "v1"
    obj.setdefault("status", {"phase": "Pending", "qosClass": "Guaranteed"})
    return obj


# --- ResourceQuota ------------------------------------------------------------------------------
def cpu_millis(quantity: Any) -> int:
    """``"500m"`` -> 500, ``"2"`` -> 2000, ``0.5`` -> 500 (the cpu quantities pods carry)."""
    text = str(quantity or "0").strip()
    if text.endswith("m"):
        return int(float(text[:-1]))
    return int(float(text) * 1000)


def _cpu_text(millis: int) -> str:
    return str(millis // 1000) if millis % 1000 == 0 else f"{millis}m"


def pod_cpu_millis(pod: dict[str, Any]) -> int:
    containers = (pod.get("spec") or {}).get("containers") or []
    return sum(
        cpu_millis(((c or {}).get("resources") or {}).get("requests", {}).get("cpu"))
        for c in containers
    )


@dataclass(frozen=True)
class PodQuota:
    """A ResourceQuota with ``pods`` and/or ``requests.cpu`` hard limits for one namespace.

    Like the real one it counts pods that are not terminal (phase neither Succeeded nor
    Failed); a pod being deleted still counts until it is gone.
    """

    name: str = "sandbox-quota"
    pods: int | None = None
    cpu_millis: int | None = None

    def refusal(self, pod_name: str, new: dict[str, Any], current: Iterable[Any]) -> str | None:
        """The 403 message if storing ``new`` would exceed a hard limit, else None."""
        live = [
            p
            for p in current
            if ((p.get("status") or {}).get("phase") or "") not in ("Succeeded", "Failed")
        ]
        requested, used, limited = [], [], []
        if self.pods is not None and len(live) + 1 > self.pods:
            requested.append("pods=1")
            used.append(f"pods={len(live)}")
            limited.append(f"pods={self.pods}")
        want, have = pod_cpu_millis(new), sum(pod_cpu_millis(p) for p in live)
        if self.cpu_millis is not None and have + want > self.cpu_millis:
            requested.append(f"requests.cpu={_cpu_text(want)}")
            used.append(f"requests.cpu={_cpu_text(have)}")
            limited.append(f"requests.cpu={_cpu_text(self.cpu_millis)}")
        if not requested:
            return None
        return (
            f'pods "{pod_name}" is forbidden: exceeded quota: {self.name}, requested: '
            f"{','.join(requested)}, used: {','.join(used)}, limited: {','.join(limited)}"
        )
