"""Kubernetes backend: the pod manifest of one sandbox and the execd boot command (pure).

Rules a reader must not break (docs/architecture.md §4):
* requests == limits; no service-account token; no service links; seccomp
  RuntimeDefault; NET_RAW dropped; soft topology spread (maxSkew 2, ScheduleAnyway).
* No token and no key is in the pod object. The job's key is in the job's Secret
  (``jobsecrets.py``), mounted ONLY into the carrier init container, which copies it to
  the memory ``emptyDir`` ``sandman-run``; execd reads it there with ``--token-key-file``,
  derives its token as HMAC-SHA256(key, its pod name from the downward API) and unlinks
  the file (``--unlink-token-file``) before it listens, so no command ever reads the key
  (the same guarantee the token file had). The main container never mounts the Secret.
* execd comes from the carrier (init container -> ``emptyDir`` mounted read-only) and is
  started with ``python3 -I -c <runpy launcher>``, leaving the task's ``PYTHONPATH`` alone.
* execd listens on the pod's IP (``--host "$POD_IP"``, ``POD_IP`` from the downward API's
  ``status.podIP``) at ``execd_port``, the port the container port and the readiness probe
  name: the kubelet's probe and the trainers connect to podIP:port, and execd's default
  host, 127.0.0.1, is not reachable there. Not 0.0.0.0: that would also expose execd on
  every other address of the pod, its loopback included.
"""

from __future__ import annotations

import shlex
from typing import Any

from kubernetes import client

from sandboxes import labels as L
from sandboxes import placement
from sandboxes.providers.base import SandboxSpec
from sandboxes.providers.kubernetes.config import KubernetesConfig
from sandboxes.providers.kubernetes.jobsecrets import SECRET_KEY, secret_name


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


POD_IP_ENV = "POD_IP"
POD_NAME_ENV = "POD_NAME"
KEY_MOUNT = "/var/run/sandman-key"  # the Secret, in the init container only
STARTUP_MOUNT = "/var/run/sandman-startup"  # the startup annotation as a file (downward API)


def boot_command(config: KubernetesConfig, startup: bool = False) -> str:
    """The main container's command: exec execd on the pod's IP, its token derived from the
    key file the init container left and the pod's name (execd unlinks the file);
    ``startup``: with the job's startup script (``STARTUP_MOUNT``).

    ``$POD_IP`` / ``$POD_NAME`` are the shell's (``:?`` stops the boot if one is unset),
    not a kubelet ``$(VAR)``: in a ``sh -c`` script that reads as command substitution
    everywhere but on a kubelet. They are read into unexported variables and unset, so
    execd's environment - and every command's - carries neither."""
    launcher = shlex.quote(execd_launcher(config.carrier_path))
    extra = f" --startup-file {STARTUP_MOUNT}/startup.sh" if startup else ""
    return (
        f'ip="${{{POD_IP_ENV}:?}}" && name="${{{POD_NAME_ENV}:?}}" && '
        f"unset {POD_IP_ENV} {POD_NAME_ENV} && "
        f'exec python3 -I -c {launcher} --host "$ip" --port {config.execd_port} '
        f'--token-key-file {config.token_dir}/key --token-name "$name" '
        f"--unlink-token-file --workspace {config.workspace}{extra}"
    )


def carrier_command(config: KubernetesConfig) -> str:
    """The init container's shell: execd's sources into the carrier volume, the job's key
    into the memory volume (readable by the task's user, whichever it is, until execd
    unlinks it at start, before any command runs)."""
    return (
        f"cp -R /carrier/. {config.carrier_path}/ && "
        f"cp {KEY_MOUNT}/{SECRET_KEY} {config.token_dir}/key"
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
        command=["sh", "-c", carrier_command(config)],
        volume_mounts=[
            client.V1VolumeMount(name="execd", mount_path=config.carrier_path),
            client.V1VolumeMount(name="sandman-run", mount_path=config.token_dir),
            client.V1VolumeMount(name="execd-key", mount_path=KEY_MOUNT, read_only=True),
        ],
        resources=client.V1ResourceRequirements(requests=carrier_res, limits=carrier_res),
        security_context=_security_context(config),
    )
    main = client.V1Container(
        name="sandbox",
        image=spec.image,
        image_pull_policy=config.image_pull_policy,
        command=["sh", "-c", boot_command(config, bool(spec.startup_script))],
        env=[
            client.V1EnvVar(
                name=POD_NAME_ENV,
                value_from=client.V1EnvVarSource(
                    field_ref=client.V1ObjectFieldSelector(field_path="metadata.name")
                ),
            ),
            client.V1EnvVar(
                name=POD_IP_ENV,
                value_from=client.V1EnvVarSource(
                    field_ref=client.V1ObjectFieldSelector(field_path="status.podIP")
                ),
            ),
        ],
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
        ]
        + _startup_mounts(spec),
        security_context=_security_context(config),
    )
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(
            name=spec.name,
            namespace=config.namespace,
            labels=pod_labels(spec),
            annotations={
                L.NONCE_ANNOTATION: spec.nonce,
                **({L.STARTUP_ANNOTATION: spec.startup_script} if spec.startup_script else {}),
            },
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
                client.V1Volume(
                    name="execd-key",
                    # 0444: the carrier runs as a non-root user and the kubelet makes secret
                    # files root's; only the init container mounts this volume.
                    secret=client.V1SecretVolumeSource(
                        secret_name=secret_name(spec.job_id), default_mode=0o444
                    ),
                ),
            ]
            + _startup_volumes(spec),
            topology_spread_constraints=_spread(spec, config),
            node_selector=_node_selector(spec, config),
        ),
    )


def _node_selector(spec: SandboxSpec, config: KubernetesConfig) -> dict[str, str] | None:
    """The job's node pool (or the default) by the pool label, never an instance type."""
    selector = placement.node_selector(
        pool_label=config.node_pool_label,
        default_pool=config.node_pool,
        job_pool=spec.node_pool,
        job_selector=dict(spec.node_selector),
    )
    return selector or None


def _startup_mounts(spec: SandboxSpec) -> list[Any]:
    if not spec.startup_script:
        return []
    return [client.V1VolumeMount(name="sandman-startup", mount_path=STARTUP_MOUNT, read_only=True)]


def _startup_volumes(spec: SandboxSpec) -> list[Any]:
    """The job's startup script, from the pod's own annotation, as ``startup.sh`` (the
    downward API: https://kubernetes.io/docs/concepts/workloads/pods/downward-api/)."""
    if not spec.startup_script:
        return []
    field = f"metadata.annotations['{L.STARTUP_ANNOTATION}']"
    item = client.V1DownwardAPIVolumeFile(
        path="startup.sh", field_ref=client.V1ObjectFieldSelector(field_path=field)
    )
    return [
        client.V1Volume(
            name="sandman-startup",
            downward_api=client.V1DownwardAPIVolumeSource(items=[item], default_mode=0o444),
        )
    ]


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
