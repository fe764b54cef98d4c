"""Kubernetes backend, part 1: configuration, the pod manifest, the client builder.

Everything here is pure except :func:`build_api_client` (which reads a kubeconfig or the
in-cluster config into a ``Configuration`` of our own; the client is built, never global).

Rules a reader must not break (ARCHITECTURE.md §3):
* requests == limits; no service-account token; no service links; seccomp
  RuntimeDefault; NET_RAW dropped; soft topology spread (maxSkew 2, ScheduleAnyway).
* The execd token travels ONLY in the env var ``SANDMAN_EXECD_TOKEN``; the boot shell
  writes it to a 0600 file on a memory ``emptyDir``, ``unset``s it and ``exec``s execd,
  so neither execd's environment nor its commands inherit it.
* execd comes from the carrier (init container -> ``emptyDir`` mounted read-only) and is
  started with ``python3 -I -c <runpy launcher>``, leaving the task's ``PYTHONPATH`` alone.
* urllib3 retries nothing (``retries = False``): a create is never blindly re-sent.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from sandboxes import labels as L
from sandboxes.providers.base import SandboxSpec

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
    max_workers: int = 16
    request_timeout_s: float = 30.0
    watch_timeout_s: int = 300
    verify_health: bool = True
    health_timeout_s: float = 2.0
    destroy_attempts: int = 5
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 30.0
    retry_pending_in_background: bool = True


def describe(exc: BaseException) -> str:
    """A short text for an API or transport error (logs, ``extra``, pending entries)."""
    if isinstance(exc, ApiException):
        return f"HTTP {exc.status} {exc.reason or ''}".strip()
    return f"{type(exc).__name__}: {exc}"


# --- the pod manifest (pure) ---------------------------------------------------------------
def _label_value(value: str) -> str:
    return value[:63].strip("-_.") or "none"


def _resources(spec: SandboxSpec) -> dict[str, str]:
    res = {"cpu": f"{spec.cpu_millis}m", "memory": str(spec.memory_bytes)}
    if spec.workspace_bytes:
        res["ephemeral-storage"] = str(spec.workspace_bytes)
    return res


def _security_context(config: KubernetesConfig) -> client.V1SecurityContext:
    return client.V1SecurityContext(
        allow_privilege_escalation=False,
        capabilities=client.V1Capabilities(
            drop=["ALL"] if config.drop_all_capabilities else ["NET_RAW"]
        ),
        seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault"),
    )


def execd_launcher(carrier_path: str) -> str:
    """``python3 -I -c`` code that runs ``python3 -m execd`` from the carrier directory.

    Equivalent to ``PYTHONPATH=<carrier> python3 -m execd`` without touching the task's
    environment: the image's own ``PYTHONPATH`` (a run condition its tests may rely on)
    reaches the commands unchanged and the carrier path never does, and ``-I`` keeps the
    task's ``PYTHON*`` variables from changing how execd itself starts.
    """
    return (
        f"import runpy, sys; sys.path.insert(0, {carrier_path!r}); "
        "runpy.run_module('execd', run_name='__main__', alter_sys=True)"
    )


def boot_command(config: KubernetesConfig) -> str:
    """The main container's shell: token env -> 0600 file, scrub, exec execd (which unlinks it)."""
    token = f"{config.token_dir}/token"
    launcher = shlex.quote(execd_launcher(config.carrier_path))
    return (
        f'umask 077 && printf %s "${L.EXECD_TOKEN_ENV}" > {token} && unset {L.EXECD_TOKEN_ENV} && '
        f"exec python3 -I -c {launcher} --port {config.execd_port} "
        f"--token-file {token} --unlink-token-file --workspace {config.workspace}"
    )


def pod_labels(spec: SandboxSpec) -> dict[str, str]:
    return {
        **dict(spec.labels),
        L.MANAGED_BY: L.VALUE_MANAGED_BY,
        L.JOB: str(spec.job_id),
        L.ROLE: _label_value(spec.role),
        L.KEY: _label_value(spec.key_hash),
        L.SANDBOX: _label_value(spec.name),
        L.EGRESS: _label_value(spec.egress),
    }


def build_pod_manifest(spec: SandboxSpec, config: KubernetesConfig) -> client.V1Pod:
    """The pod for one sandbox: requests == limits, no SA token, no service links, soft spread."""
    resources = _resources(spec)
    carrier_res = {"cpu": "100m", "memory": "64Mi"}
    owners = None
    if spec.owner is not None:
        owners = [
            client.V1OwnerReference(
                api_version=spec.owner.api_version,
                kind=spec.owner.kind,
                name=spec.owner.name,
                uid=spec.owner.uid,
                controller=False,
                block_owner_deletion=False,
            )
        ]
    carrier = client.V1Container(
        name="execd-carrier",
        image=config.carrier_image,
        image_pull_policy=config.image_pull_policy,
        command=["sh", "-c", f"cp -R /carrier/. {config.carrier_path}/"],
        volume_mounts=[client.V1VolumeMount(name="execd", mount_path=config.carrier_path)],
        resources=client.V1ResourceRequirements(requests=carrier_res, limits=carrier_res),
        security_context=_security_context(config),
    )
    main = client.V1Container(
        name="sandbox",
        image=spec.image,
        image_pull_policy=config.image_pull_policy,
        command=["sh", "-c", boot_command(config)],
        env=[client.V1EnvVar(name=L.EXECD_TOKEN_ENV, value=spec.token)],
        ports=[
            client.V1ContainerPort(name="execd", container_port=config.execd_port, protocol="TCP")
        ],
        resources=client.V1ResourceRequirements(requests=resources, limits=dict(resources)),
        readiness_probe=client.V1Probe(
            http_get=client.V1HTTPGetAction(path="/health", port=config.execd_port),
            period_seconds=1,
            timeout_seconds=1,
            failure_threshold=3,
        ),
        volume_mounts=[
            client.V1VolumeMount(name="execd", mount_path=config.carrier_path, read_only=True),
            client.V1VolumeMount(name="sandman-run", mount_path=config.token_dir),
        ],
        security_context=_security_context(config),
    )
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(
            name=spec.name,
            namespace=config.namespace,
            labels=pod_labels(spec),
            annotations={L.NONCE_ANNOTATION: spec.nonce},
            owner_references=owners,
        ),
        spec=client.V1PodSpec(
            automount_service_account_token=False,
            enable_service_links=False,
            restart_policy="Never",
            termination_grace_period_seconds=config.termination_grace_s,
            security_context=client.V1PodSecurityContext(
                seccomp_profile=client.V1SeccompProfile(type="RuntimeDefault")
            ),
            init_containers=[carrier],
            containers=[main],
            volumes=[
                client.V1Volume(
                    name="execd", empty_dir=client.V1EmptyDirVolumeSource(size_limit="64Mi")
                ),
                client.V1Volume(
                    name="sandman-run",
                    empty_dir=client.V1EmptyDirVolumeSource(medium="Memory", size_limit="1Mi"),
                ),
            ],
            topology_spread_constraints=_spread(spec, config),
        ),
    )


def _spread(spec: SandboxSpec, config: KubernetesConfig) -> list[Any] | None:
    """Soft spread of the job's pods over nodes: crowded nodes fail address assignment."""
    if not config.topology_spread:
        return None
    return [
        client.V1TopologySpreadConstraint(
            max_skew=config.spread_max_skew,
            topology_key="kubernetes.io/hostname",
            when_unsatisfiable="ScheduleAnyway",
            label_selector=client.V1LabelSelector(
                match_labels={L.MANAGED_BY: L.VALUE_MANAGED_BY, L.JOB: str(spec.job_id)}
            ),
        )
    ]


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
