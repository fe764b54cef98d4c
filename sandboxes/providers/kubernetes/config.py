"""Kubernetes backend: its configuration, the API client builder, the error helpers.

Everything here is pure except :func:`build_api_client`, which reads a kubeconfig or the
in-cluster config into a ``Configuration`` of our own: the client is built, never global.

Rules a reader must not break:
* urllib3 retries nothing (``retries = False``): a create is never blindly re-sent.
* The connection pool holds one connection per worker thread plus the watch and slack;
  a smaller pool makes worker threads wait for each other's connections.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from sandboxes import labels as L
from sandboxes import placement
from sandman_site.errors import SandmanError

SELECTOR = f"{L.MANAGED_BY}={L.VALUE_MANAGED_BY}"
TRANSPORT_ERRORS = (urllib3.exceptions.HTTPError, OSError)
DEFAULT_CARRIER_IMAGE = "ghcr.io/sandman-rl/execd-carrier:0.1.0"


@dataclass(frozen=True)
class KubernetesConfig:
    namespace: str = "sandman-sandboxes"
    kubeconfig: str | None = None
    context: str | None = None
    in_cluster: bool | None = None  # None: in-cluster if available, else kubeconfig
    execd_port: int = 8700
    carrier_image: str = DEFAULT_CARRIER_IMAGE
    carrier_path: str = "/opt/sandman"
    token_dir: str = "/var/run/sandman"
    workspace: str = "/workspace"
    image_pull_policy: str = "IfNotPresent"
    spread_max_skew: int = 2
    topology_spread: bool = True  # False only to measure its effect (bench/k8s_burst.py)
    drop_all_capabilities: bool = False  # ALL breaks images that chown or setuid as root
    termination_grace_s: int = 5
    # How long ``destroy`` waits for a Terminating pod to be gone (DELETED) before leaving
    # it pending; None: its grace period plus ``request_timeout_s``.
    delete_confirm_s: float | None = None
    max_workers: int = 16
    request_timeout_s: float = 30.0
    # kube-apiserver's --request-timeout: after a 504 a create may land until then.
    server_request_timeout_s: float = 60.0
    watch_timeout_s: int = 300
    verify_health: bool = True
    # How long a Ready pod waits for its Started Event (Events trail on their own stream).
    events_grace_s: float = 2.0
    health_timeout_s: float = 2.0
    destroy_attempts: int = 5
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    retry_pending_in_background: bool = True
    list_page_size: int = 500  # ``limit`` of every list; 0 = one unpaged list
    list_restarts: int = 3  # a continue token expired mid-list restarts the list this often
    retry_after_max_s: float = 30.0  # a 429's Retry-After is honoured up to this
    throttle_attempts: int = 8  # sends of one create / list page while answered 429
    quota_attempts: int = 6  # sends of one create while its quota is exceeded (403)
    # Placement (sandboxes.placement): pods select nodes by this node label; ``node_pool``
    # is the pool of jobs that name none (empty: no pool selector). Never an instance type.
    node_pool_label: str = "sandman.dev/node-pool"
    node_pool: str = ""

    def __post_init__(self) -> None:
        try:
            placement.check_label(
                self.node_pool_label, self.node_pool, where="SANDMAN_K8S_NODE_POOL_LABEL"
            )
        except SandmanError as exc:
            raise ValueError(exc.message) from exc


def config_from_settings(settings: Any) -> KubernetesConfig:
    """``SANDMAN_NAMESPACE``, ``SANDMAN_KUBECONFIG`` and the optional ``SANDMAN_EXECD_*`` /
    ``SANDMAN_K8S_*`` values of Django ``settings``; defaults where unset or empty."""

    def get(name: str, default: Any) -> Any:
        value = getattr(settings, name, None)
        return default if value is None or value == "" else value

    defaults = KubernetesConfig()
    return KubernetesConfig(
        namespace=get("SANDMAN_NAMESPACE", defaults.namespace),
        kubeconfig=get("SANDMAN_KUBECONFIG", None),
        execd_port=int(get("SANDMAN_EXECD_PORT", defaults.execd_port)),
        carrier_image=get("SANDMAN_EXECD_CARRIER_IMAGE", defaults.carrier_image),
        workspace=get("SANDMAN_K8S_WORKSPACE", defaults.workspace),
        max_workers=int(get("SANDMAN_K8S_WORKERS", defaults.max_workers)),
        request_timeout_s=float(get("SANDMAN_K8S_REQUEST_TIMEOUT_S", defaults.request_timeout_s)),
        watch_timeout_s=int(get("SANDMAN_K8S_WATCH_TIMEOUT_S", defaults.watch_timeout_s)),
        verify_health=bool(get("SANDMAN_K8S_VERIFY_HEALTH", defaults.verify_health)),
        drop_all_capabilities=bool(
            get("SANDMAN_K8S_DROP_ALL_CAPABILITIES", defaults.drop_all_capabilities)
        ),
        node_pool_label=get("SANDMAN_K8S_NODE_POOL_LABEL", defaults.node_pool_label),
        node_pool=get("SANDMAN_K8S_NODE_POOL", defaults.node_pool),
    )


def describe(exc: BaseException) -> str:
    """A short text for an API or transport error (logs, ``extra``, pending entries)."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"


def build_api_client(config: KubernetesConfig, *, host: str | None = None) -> client.ApiClient:
    """A client built, not global: kubeconfig or in-cluster loaded INTO our Configuration."""
    configuration = client.Configuration()
    if host:
        configuration.host = host
    elif config.kubeconfig:
        kube_config.load_kube_config(
            config_file=config.kubeconfig,
            context=config.context,
            client_configuration=configuration,
        )
    else:
        try:
            if config.in_cluster is False:
                raise kube_config.ConfigException("in-cluster config disabled")
            kube_config.load_incluster_config(client_configuration=configuration)
        except kube_config.ConfigException:
            if config.in_cluster:
                raise
            kube_config.load_kube_config(context=config.context, client_configuration=configuration)
    # One connection per worker thread plus the watch and a little slack.
    configuration.connection_pool_maxsize = config.max_workers + 4
    # Our own retry rules apply (a create is never blindly re-sent); urllib3 retries none.
    configuration.retries = False
    return client.ApiClient(configuration)


def job_ids_named(items: list[Any], name_of: Callable[[int], str]) -> list[int]:
    """Job ids of listed per-job objects (anchors, key Secrets): the ``L.JOB`` label of each
    object whose name is the one ``name_of(job_id)`` gives, sorted."""
    job_ids = []
    for item in items:
        meta = item.metadata or client.V1ObjectMeta()
        job = (meta.labels or {}).get(L.JOB, "")
        if job.isdigit() and meta.name == name_of(int(job)):
            job_ids.append(int(job))
    return sorted(job_ids)
