"""Where a job's sandboxes may run: a node pool chosen by its label, never an instance type.

Table A14 of the paper: nine jobs pinned to one instance type never started when that
type ran out, while nodes of the same pool with another type sat free. So a job (or the
service's default) names a *node pool* — the value of one configurable node label
(``SANDMAN_K8S_NODE_POOL_LABEL``, e.g. ``karpenter.sh/nodepool``,
``eks.amazonaws.com/nodegroup``, ``cloud.google.com/gke-nodepool``) — and may add other node
labels; a selector on an instance-type label is refused with ``instance_type_selector``
(HTTP 400) naming why, before anything is written.

Pure: no Django, no Kubernetes client. Rule a reader must not break: every selector that
reaches a pod manifest went through :func:`check_selector` (job create and the provider's
own configuration both call it), so no path pins a pod to an instance type.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sandman_site.errors import InvalidInput

# Labels naming a machine shape rather than a pool (well-known Kubernetes labels and the
# common autoscalers'); any key whose name part is one of these words is refused too.
INSTANCE_TYPE_KEYS = frozenset(
    {
        "node.kubernetes.io/instance-type",
        "beta.kubernetes.io/instance-type",
        "karpenter.k8s.aws/instance-type",
        "karpenter.k8s.aws/instance-family",
        "karpenter.k8s.aws/instance-size",
        "cloud.google.com/machine-family",
    }
)
_INSTANCE_WORDS = frozenset(
    {"instance-type", "instance-family", "instance-size", "machine-type", "machine-family"}
)
MAX_SELECTOR_LABELS = 16

# Kubernetes label syntax (docs: "Labels and Selectors", syntax and character set).
_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_PREFIX = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*"
_KEY = re.compile(rf"^(({_PREFIX})/)?{_NAME}$")
_VALUE = re.compile(rf"^({_NAME})?$")


class InstanceTypeSelector(InvalidInput):
    """A selector pinned sandboxes to an instance type (paper Table A14)."""

    code = "instance_type_selector"
    status = 400


def is_instance_type_key(key: str) -> bool:
    name = key.rsplit("/", 1)[-1].lower()
    return key.lower() in INSTANCE_TYPE_KEYS or name in _INSTANCE_WORDS


def check_label(key: str, value: str, *, where: str) -> None:
    """A valid label key and value that names no instance type; else a clear 4xx."""
    if not isinstance(key, str) or not isinstance(value, str):
        raise InvalidInput(f"{where}: label keys and values are strings")
    prefix = key.split("/", 1)[0] if "/" in key else ""
    if not _KEY.match(key) or len(prefix) > 253:
        raise InvalidInput(f"{where}: {key!r} is not a Kubernetes label key")
    if not _VALUE.match(value):
        raise InvalidInput(f"{where}: {value!r} is not a Kubernetes label value for {key}")
    if is_instance_type_key(key):
        raise InstanceTypeSelector(
            f"{where}: {key} selects an instance type; select a node pool by its label "
            "instead (paper Table A14: jobs pinned to one instance type never started when "
            "that type ran out while the pool had other nodes free)",
            {"key": key},
        )


def check_selector(selector: Mapping[str, str], *, where: str) -> dict[str, str]:
    """The selector as a plain dict after :func:`check_label` on every entry."""
    if not isinstance(selector, Mapping):
        raise InvalidInput(f"{where} must be an object of node labels")
    if len(selector) > MAX_SELECTOR_LABELS:
        raise InvalidInput(f"{where} holds at most {MAX_SELECTOR_LABELS} labels")
    for key, value in selector.items():
        check_label(key, value, where=where)
    return dict(selector)


def node_selector(
    *,
    pool_label: str,
    default_pool: str,
    job_pool: str,
    job_selector: Mapping[str, str],
) -> dict[str, str]:
    """The pod's ``nodeSelector``: the job's pool (or the default) under the pool label,
    plus the job's other labels; empty when neither names anything."""
    out = dict(job_selector)
    pool = job_pool or default_pool
    if pool and pool_label:
        out[pool_label] = pool
    return out
