"""The ``kubernetes`` backend: one pod per sandbox, readiness from ONE list+watch.

``KubernetesProvider`` implements ``sandboxes.providers.base.Provider``; it is a facade
over collaborators that each receive what they use. Module map: ``config`` (settings,
the API client builder), ``manifest`` (the pod), ``calls`` (the executor of client calls,
background tasks), ``reflector`` (the one list+watch machinery of both informers),
``informer`` (the pod informer and pod facts from raw JSON), ``events`` (the Events
informer and per-pod facts),
``readiness`` (the tracker behind ``wait_ready``), ``creator`` (create and its ambiguous
outcomes), ``deleter`` (deletes and the pending set), ``terminating`` (Terminating and
gone pods: what confirms a delete), ``late`` (creates that may land after their read-back
found nothing), ``anchors`` (owners and per-job anchors), ``jobsecrets`` (the per-job
execd-key Secret), ``listing`` (``list_owned``), ``paging`` (lists in pages), ``retry``
(which refusals are sent again, and when), ``health`` (execd's health: the one execd
call), ``provider`` (the facade).

Rule a reader must not break: nothing above ``providers/`` imports a module of this
package other than this one; the names below are its public surface.
"""

from __future__ import annotations

from sandboxes.providers.kubernetes.config import (
    DEFAULT_CARRIER_IMAGE,
    SELECTOR,
    KubernetesConfig,
    build_api_client,
)
from sandboxes.providers.kubernetes.deleter import PendingDelete
from sandboxes.providers.kubernetes.informer import (
    pod_failure,
    pod_informer,
    pod_is_ready,
    ready_info,
)
from sandboxes.providers.kubernetes.late import LateCreates
from sandboxes.providers.kubernetes.manifest import (
    boot_command,
    build_pod_manifest,
    carrier_command,
    execd_launcher,
    pod_labels,
)
from sandboxes.providers.kubernetes.provider import KubernetesProvider

__all__ = [
    "DEFAULT_CARRIER_IMAGE",
    "SELECTOR",
    "KubernetesConfig",
    "KubernetesProvider",
    "LateCreates",
    "PendingDelete",
    "boot_command",
    "build_api_client",
    "build_pod_manifest",
    "carrier_command",
    "execd_launcher",
    "pod_failure",
    "pod_informer",
    "pod_is_ready",
    "pod_labels",
    "ready_info",
]
