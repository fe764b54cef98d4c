"""Kubernetes backend: one pod per sandbox, readiness from ONE list+watch of Sandman's pods.

Ownership rules a reader must not break (paper §4.4, Appendix F; ``base.py``):

* Every create carries a pre-assigned name and a nonce annotation. The HTTP call runs in a
  worker thread and runs to settlement even if the awaiting task is cancelled: a queued
  item that never started is dropped (nothing was sent); otherwise the provider waits for
  the answer and deletes whatever got stored, holding it in its pending set meanwhile.
* After a 5xx or a transport error the pod is read back by name and deleted with a UID
  precondition only if it carries this create's nonce; then ``ProviderAmbiguous`` with the
  identity in ``extra``. A 403/other 4xx sends no read and no delete. A 409 reads the
  holder: our nonce means an earlier attempt of this very create (adopted), any other is
  ``ProviderConflict`` and the pod is left alone.
* ``destroy`` is idempotent (404, or 409 on the UID precondition, means gone). A delete
  that fails, loses its answer or is cancelled enters the pending set (``on_pending``),
  is retried with backoff 1 s -> 30 s and leaves it only when confirmed (``on_deleted``).
* Readiness comes from one informer (list, then watch from the list's resourceVersion;
  410 -> re-list), never from per-pod polling. The address is ``podIP:port``, never a
  Service; the port is ``sandman.dev/execd-port`` when a pod carries it (the stand-in's
  ``--run-execd``), else the configured execd port.

Token delivery: the per-sandbox token travels in the env var ``SANDMAN_EXECD_TOKEN``; the
container's shell writes it to a file on a memory ``emptyDir``, ``unset``s it and ``exec``s
execd with ``--token-file``, so neither execd's environment nor its commands inherit it.
execd carrier: an init container (``SANDMAN_EXECD_CARRIER_IMAGE``, built from
``k8s/carrier/Dockerfile``) copies ``/carrier/execd`` into an ``emptyDir`` that the main
container mounts read-only at ``/opt/sandman``; execd starts from there as
``python3 -I -c <runpy launcher>`` (see :func:`execd_launcher`) rather than with
``PYTHONPATH`` set, so the task image's own ``PYTHONPATH`` is left as it was.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import json
import logging
import shlex
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import aiohttp
import urllib3
from kubernetes import client, watch
from kubernetes import config as kube_config
from kubernetes.client.exceptions import ApiException

from sandboxes import labels as L
from sandboxes.providers.base import Handle, OwnedSandbox, OwnerRef, ReadyInfo, SandboxSpec
from sandman_site.errors import (
    ProviderAmbiguous,
    ProviderConflict,
    ProviderError,
    ProviderForbidden,
    SandboxNotReady,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
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


@dataclass(frozen=True)
class PendingDelete:
    """A pod Sandman owns and must delete; ``uid`` is empty when only the name is known."""

    name: str
    uid: str
    nonce: str
    attempts: int = 0
    last_error: str = ""


class _Unconfirmed(Exception):
    """A delete whose outcome is unknown or failed: keep the pod pending."""


@dataclass
class _CreateOutcome:
    handle: Handle | None = None
    error: ProviderError | None = None
    pending: PendingDelete | None = None
    deleted: tuple[str, str] | None = None
    stored_at: float = 0.0  # time.monotonic() when the API confirmed the pod stored
    version: str = ""  # the pod's resourceVersion in that answer


@dataclass
class _Waiter:
    name: str
    uid: str
    future: asyncio.Future[dict[str, Any]] = field(repr=False)


def _err(
    cls: type[ProviderError], message: str, extra: dict[str, Any], cause: BaseException
) -> ProviderError:
    error = cls(message, extra)
    error.__cause__ = cause
    return error


def _describe(exc: BaseException) -> str:
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
    """The main container's shell: token env -> 0600 file, scrub, exec execd."""
    token = f"{config.token_dir}/token"
    launcher = shlex.quote(execd_launcher(config.carrier_path))
    return (
        f'umask 077 && printf %s "${L.EXECD_TOKEN_ENV}" > {token} && unset {L.EXECD_TOKEN_ENV} && '
        f"exec python3 -I -c {launcher} --port {config.execd_port} "
        f"--token-file {token} --workspace {config.workspace}"
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
            topology_spread_constraints=[
                client.V1TopologySpreadConstraint(
                    max_skew=config.spread_max_skew,
                    topology_key="kubernetes.io/hostname",
                    when_unsatisfiable="ScheduleAnyway",
                    label_selector=client.V1LabelSelector(
                        match_labels={L.MANAGED_BY: L.VALUE_MANAGED_BY, L.JOB: str(spec.job_id)}
                    ),
                )
            ],
        ),
    )


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


# --- readiness facts from a pod (raw JSON: the informer never builds models) ---------------
Pod = dict[str, Any]


def _parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _meta(pod: Pod) -> dict[str, Any]:
    return pod.get("metadata") or {}


def _status(pod: Pod) -> dict[str, Any]:
    return pod.get("status") or {}


def _condition_time(pod: Pod, ctype: str) -> dt.datetime | None:
    for cond in _status(pod).get("conditions") or []:
        if cond.get("type") == ctype and cond.get("status") == "True":
            return _parse_time(cond.get("lastTransitionTime"))
    return None


def pod_is_ready(pod: Pod) -> bool:
    return bool(_status(pod).get("podIP")) and _condition_time(pod, "Ready") is not None


def pod_failure(pod: Pod) -> str | None:
    """Why this pod can never become Ready, or None."""
    if _meta(pod).get("deletionTimestamp"):
        return "terminating"
    phase = _status(pod).get("phase")
    if phase in ("Failed", "Succeeded"):
        message = (_status(pod).get("message") or "").strip()
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
        "egress": (_meta(pod).get("labels") or {}).get(L.EGRESS, ""),
    }


def ready_info(pod: Pod, config: KubernetesConfig) -> ReadyInfo:
    """What a Ready pod tells us: podIP:port, node, timeline, image cache, address failures.

    The stand-in's ``standin.sandman.dev/*`` stamps are used when present; a real cluster
    gives the conditions (whole seconds) and the container's start time instead.
    """
    ann = _meta(pod).get("annotations") or {}
    ip = _status(pod).get("podIP") or ""
    port = int(ann.get(L.EXECD_PORT_ANNOTATION) or config.execd_port)
    started = None
    for cs in _status(pod).get("containerStatuses") or []:
        if cs.get("name") == "sandbox":
            started = _parse_time(((cs.get("state") or {}).get("running") or {}).get("startedAt"))
    candidates = {
        "api_created": _parse_time(ann.get(L.STANDIN_CREATED_AT))
        or _parse_time(_meta(pod).get("creationTimestamp")),
        "scheduled": _parse_time(ann.get(L.STANDIN_SCHEDULED_AT))
        or _condition_time(pod, "PodScheduled"),
        "address_assigned": _parse_time(ann.get(L.STANDIN_ADDRESS_ASSIGNED_AT)),
        "image_pulled": _parse_time(ann.get(L.STANDIN_PULLED_AT)),
        "started": _parse_time(ann.get(L.STANDIN_STARTED_AT)) or started,
        "ready": _parse_time(ann.get(L.STANDIN_READY_AT)) or _condition_time(pod, "Ready"),
    }
    present = ann.get(L.STANDIN_IMAGE_PRESENT)
    return ReadyInfo(
        address=f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}",
        node=(pod.get("spec") or {}).get("nodeName") or "",
        guards=_guards(pod),
        timeline={k: v for k, v in candidates.items() if v is not None},
        image_present=None if present is None else present == "true",
        pull_ms=float(ann[L.STANDIN_PULL_MS]) if L.STANDIN_PULL_MS in ann else None,
        address_failures=int(ann.get(L.STANDIN_ADDRESS_FAILURES) or 0),
    )


# --- the informer: one list+watch, run in its own thread ---------------------------------
def _raw(resp: Any) -> Any:
    """Check a ``_preload_content=False`` answer's status like the client would."""
    status = getattr(resp, "status", 200)
    if not 200 <= status <= 299:
        body = resp.data.decode("utf-8", "replace") if hasattr(resp, "data") else ""
        resp.release_conn()
        raise ApiException(status=status, reason=getattr(resp, "reason", ""), body=body)
    return resp


class PodInformer:
    """Lists Sandman's pods, then watches from the list's version; 410 -> list again.

    Runs in a dedicated thread (the watch blocks) and hands every change to the owning
    event loop with ``call_soon_threadsafe``; the callbacks run only on that loop. Events
    stay raw JSON: building a client model per event costs ~15x the parse.
    """

    def __init__(
        self,
        core: client.CoreV1Api,
        config: KubernetesConfig,
        loop: asyncio.AbstractEventLoop,
        on_sync: Callable[[list[Pod], float, str], None],
        on_event: Callable[[str, Pod], None],
    ) -> None:
        self._core, self._config, self._loop = core, config, loop
        self._on_sync, self._on_event = on_sync, on_event
        self._stop = threading.Event()
        self._resp: Any = None
        self._thread = threading.Thread(target=self._run, name="sandman-pod-informer", daemon=True)
        self.lists = 0
        self.watches = 0
        self.relists_after_gone = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        # Shutting the stream's socket down makes the blocked read return at once; repeat:
        # a watch whose response headers were still on their way has no socket yet.
        while self._thread.is_alive() and time.monotonic() < deadline:
            self._interrupt()
            self._thread.join(timeout=0.05)

    def _interrupt(self) -> None:
        resp = self._resp
        sock = getattr(getattr(resp, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def _post(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self._stop.set()

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                self._list_then_watch()
                failures = 0
            except ApiException as exc:
                if exc.status == 410:
                    self.relists_after_gone += 1
                    continue
                failures += 1
                log.warning("pod informer: %s; listing again", _describe(exc))
            except (*TRANSPORT_ERRORS, ValueError) as exc:
                if self._stop.is_set():
                    break
                failures += 1
                log.warning("pod informer: %s; listing again", _describe(exc))
            cfg = self._config
            delay = min(cfg.backoff_max_s, cfg.backoff_initial_s * 2 ** min(failures, 5))
            self._stop.wait(delay if failures else 0)

    def _list_then_watch(self) -> None:
        cfg = self._config
        started = time.monotonic()
        resp = _raw(
            self._core.list_namespaced_pod(
                cfg.namespace,
                label_selector=SELECTOR,
                _request_timeout=cfg.request_timeout_s,
                _preload_content=False,
            )
        )
        listed = json.loads(resp.data)
        self.lists += 1
        version = listed["metadata"]["resourceVersion"]
        self._post(self._on_sync, listed.get("items") or [], started, version)
        while not self._stop.is_set():
            version = self._watch_once(version)

    def _watch_once(self, version: str) -> str:
        """One watch stream from ``version``; returns the last version seen."""
        cfg = self._config
        self.watches += 1
        resp = self._core.list_namespaced_pod(
            cfg.namespace,
            label_selector=SELECTOR,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=cfg.watch_timeout_s,
            watch=True,
            _preload_content=False,
            _request_timeout=float(cfg.watch_timeout_s + 30),
        )
        self._resp = resp
        try:
            _raw(resp)
            for line in watch.watch.iter_resp_lines(resp):
                if not line.strip():
                    continue
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    raise ApiException(status=obj.get("code", 500), reason=obj.get("message", ""))
                version = _meta(obj).get("resourceVersion") or version
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._post(self._on_event, kind, obj)
                if self._stop.is_set():
                    break
        finally:
            self._resp = None
            resp.release_conn()
        return version


# --- the provider --------------------------------------------------------------------------
class KubernetesProvider:
    name = "kubernetes"

    def __init__(
        self,
        config: KubernetesConfig | None = None,
        *,
        api_client: client.ApiClient | None = None,
        backoff: Callable[[int], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        on_pending: Callable[[PendingDelete], None] | None = None,
        on_deleted: Callable[[str, str], None] | None = None,
        work_item_hook: Callable[[str, str], None] | None = None,
    ) -> None:
        self.config = config or KubernetesConfig()
        self._owns_client = api_client is None
        self.api_client = api_client or build_api_client(self.config)
        self.core = client.CoreV1Api(self.api_client)
        self._backoff = backoff or (
            lambda n: min(self.config.backoff_max_s, self.config.backoff_initial_s * 2**n)
        )
        self._sleep = sleep
        self.on_pending, self.on_deleted = on_pending, on_deleted
        self.work_item_hook = work_item_hook
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.config.max_workers, thread_name_prefix="sandman-k8s"
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self.informer: PodInformer | None = None
        self._cache: dict[str, Pod] = {}
        # Recently deleted uids: a wait_ready that starts after the DELETED event still fails
        # at once instead of waiting out its budget. Bounded, oldest first out.
        self._deleted: OrderedDict[str, None] = OrderedDict()
        # Creates this provider saw stored (name -> uid, when, version) and the last list
        # (when it started, its version): together they tell "deleted before we ever saw it".
        self._stored: dict[str, tuple[str, float, str]] = {}
        self._listed: tuple[float, str] | None = None
        self._waiters: dict[str, list[_Waiter]] = {}
        self._pending: dict[str, PendingDelete] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._retrier: asyncio.Task[None] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Any = None, **kwargs: Any) -> KubernetesProvider:
        """Build from Django settings (``SANDMAN_NAMESPACE``, ``SANDMAN_KUBECONFIG``, and the
        optional ``SANDMAN_EXECD_*`` / ``SANDMAN_K8S_*`` values below, defaults if unset)."""
        if settings is None:
            from django.conf import settings

        def get(name: str, default: Any) -> Any:
            value = getattr(settings, name, None)
            return default if value is None or value == "" else value

        defaults = KubernetesConfig()
        config = KubernetesConfig(
            namespace=get("SANDMAN_NAMESPACE", defaults.namespace),
            kubeconfig=get("SANDMAN_KUBECONFIG", None),
            execd_port=int(get("SANDMAN_EXECD_PORT", defaults.execd_port)),
            carrier_image=get("SANDMAN_EXECD_CARRIER_IMAGE", defaults.carrier_image),
            workspace=get("SANDMAN_K8S_WORKSPACE", defaults.workspace),
            max_workers=int(get("SANDMAN_K8S_WORKERS", defaults.max_workers)),
            request_timeout_s=float(
                get("SANDMAN_K8S_REQUEST_TIMEOUT_S", defaults.request_timeout_s)
            ),
            watch_timeout_s=int(get("SANDMAN_K8S_WATCH_TIMEOUT_S", defaults.watch_timeout_s)),
            verify_health=bool(get("SANDMAN_K8S_VERIFY_HEALTH", defaults.verify_health)),
            drop_all_capabilities=bool(
                get("SANDMAN_K8S_DROP_ALL_CAPABILITIES", defaults.drop_all_capabilities)
            ),
        )
        return cls(config, **kwargs)

    # --- plumbing ---------------------------------------------------------------------------
    def _ensure_started(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise ProviderError("the kubernetes provider is closed")
        if self._loop is None:
            self._loop = loop
            self.informer = PodInformer(self.core, self.config, loop, self._on_sync, self._on_event)
            self.informer.start()
        return loop

    def _submit(
        self, op: str, name: str, fn: Callable[..., T], *args: Any
    ) -> concurrent.futures.Future[T]:
        hook = self.work_item_hook

        def item() -> T:
            if hook is not None:
                hook(op, name)  # a test gate may hold the item here, before any request
            return fn(*args)

        return self._executor.submit(item)

    async def _in_thread(self, op: str, name: str, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking client call; a cancelled caller does not stop the call."""
        answer = asyncio.wrap_future(self._submit(op, name, fn, *args))
        # If the caller is gone, nobody reads the outcome: mark it read (the caller's own
        # cancellation path has already put the pod in the pending set).
        answer.add_done_callback(lambda f: f.cancelled() or f.exception())
        return await asyncio.shield(answer)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _hook(self, fn: Callable[..., None] | None, *args: Any) -> None:
        if fn is None:
            return
        try:
            fn(*args)
        except Exception:  # a broken hook must not lose the pod: it stays in our set
            log.exception("kubernetes provider hook %s failed", fn)

    # --- informer callbacks (loop thread) ---------------------------------------------------
    def _on_sync(self, pods: list[Pod], started: float, version: str) -> None:
        self._listed = (started, version)
        fresh = {_meta(p)["name"]: p for p in pods}
        for name in set(self._cache) - set(fresh):
            self._gone(name, _meta(self._cache[name]).get("uid", ""))
        self._cache = fresh
        for name in set(fresh) | set(self._waiters):
            self._evaluate(name)

    def _missed(self, name: str, uid: str) -> bool:
        """True if ``name`` (stored by us as ``uid``) must have been in the last list.

        A list that started after our create was answered, or whose version is not older
        than the create's, contains the pod unless it was deleted: absent means gone, even
        though no watch ever showed it (deleted before the informer's first list).
        """
        stored = self._stored.get(name)
        if stored is None or (uid and stored[0] != uid) or self._listed is None:
            return False
        list_started, list_version = self._listed
        if stored[1] < list_started:
            return True
        try:
            return int(list_version) >= int(stored[2])
        except ValueError:  # versions are opaque on some servers: no conclusion
            return False

    def _on_event(self, kind: str, pod: Pod) -> None:
        name, uid = _meta(pod).get("name", ""), _meta(pod).get("uid", "")
        if kind == "DELETED":
            cached = self._cache.get(name)
            if cached is not None and _meta(cached).get("uid") == uid:
                del self._cache[name]
            self._gone(name, uid)
            return
        self._cache[name] = pod
        self._evaluate(name)

    def _gone(self, name: str, uid: str) -> None:
        self._deleted[uid] = None
        if name in self._stored and self._stored[name][0] in ("", uid):
            del self._stored[name]
        while len(self._deleted) > 10_000:
            self._deleted.popitem(last=False)
        for waiter in self._waiters.get(name, []):
            if not waiter.future.done() and waiter.uid in ("", uid):
                waiter.future.set_exception(
                    SandboxNotReady(
                        f"pod {name} was deleted before it was Ready",
                        {"name": name, "uid": uid, "reason": "deleted"},
                    )
                )

    def _evaluate(self, name: str) -> None:
        pod = self._cache.get(name)
        if pod is None:
            for waiter in self._waiters.get(name, []):
                gone = waiter.uid in self._deleted or self._missed(name, waiter.uid)
                if gone and not waiter.future.done():
                    waiter.future.set_exception(
                        SandboxNotReady(
                            f"pod {name} was deleted before it was Ready",
                            {"name": name, "uid": waiter.uid, "reason": "deleted"},
                        )
                    )
            return
        for waiter in self._waiters.get(name, []):
            if waiter.future.done():
                continue
            uid = _meta(pod).get("uid", "")
            extra = {"name": name, "uid": uid, "phase": _status(pod).get("phase")}
            failure = pod_failure(pod)
            if waiter.uid and uid != waiter.uid:
                waiter.future.set_exception(
                    SandboxNotReady(
                        f"pod {name} was replaced by another pod", {**extra, "reason": "replaced"}
                    )
                )
            elif failure is not None:
                waiter.future.set_exception(
                    SandboxNotReady(
                        f"pod {name} cannot become Ready: {failure}", {**extra, "reason": failure}
                    )
                )
            elif pod_is_ready(pod):
                waiter.future.set_result(pod)

    # --- create ---------------------------------------------------------------------------
    async def create(self, spec: SandboxSpec) -> Handle:
        self._ensure_started()
        manifest = build_pod_manifest(spec, self.config)
        abandoned = threading.Event()
        work = self._submit("create", spec.name, self._create_sync, manifest, spec, abandoned)
        answer = asyncio.wrap_future(work)
        try:
            outcome = await asyncio.shield(answer)
        except asyncio.CancelledError:
            if work.cancel():  # still queued: no request was ever sent
                raise
            abandoned.set()  # if the thread has not sent it yet, it never will
            cleanup = self._spawn(self._settle_abandoned(answer, spec))
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(cleanup)  # a second cancel leaves it to our task
            raise
        return self._finish(outcome)

    def _finish(self, outcome: _CreateOutcome) -> Handle:
        if outcome.pending is not None:
            self._add_pending(outcome.pending)
        if outcome.deleted is not None:
            self._hook(self.on_deleted, *outcome.deleted)
        if outcome.error is not None:
            raise outcome.error
        if outcome.handle is None:
            raise ProviderError("create was not sent")
        if outcome.stored_at:
            self._stored[outcome.handle.name] = (
                outcome.handle.uid,
                outcome.stored_at,
                outcome.version,
            )
        return outcome.handle

    async def _settle_abandoned(
        self, answer: asyncio.Future[_CreateOutcome], spec: SandboxSpec
    ) -> None:
        """The caller is gone: own whatever the create stored and delete it."""
        try:
            handle = self._finish(await answer)
        except ProviderError as exc:
            log.info("abandoned create of %s settled without a pod to own: %s", spec.name, exc)
            return
        self._add_pending(PendingDelete(handle.name, handle.uid, handle.nonce))
        try:
            await self.destroy(handle)
        except ProviderError:
            log.warning("abandoned pod %s stays pending deletion", handle.name, exc_info=True)

    def _create_sync(
        self, manifest: client.V1Pod, spec: SandboxSpec, abandoned: threading.Event
    ) -> _CreateOutcome:
        if abandoned.is_set():
            return _CreateOutcome()
        extra = {"name": spec.name, "nonce": spec.nonce, "namespace": self.config.namespace}
        try:
            pod = self.core.create_namespaced_pod(
                self.config.namespace, manifest, _request_timeout=self.config.request_timeout_s
            )
        except ApiException as exc:
            status = exc.status or 0
            if status == 409:
                return self._conflict_sync(spec, exc)
            if 400 <= status < 500:
                cls = ProviderForbidden if status == 403 else ProviderError
                return _CreateOutcome(
                    error=_err(
                        cls,
                        f"create of pod {spec.name} refused: {_describe(exc)}",
                        {**extra, "status": status},
                        exc,
                    )
                )
            return self._reclaim_sync(spec, exc)
        except TRANSPORT_ERRORS as exc:
            return self._reclaim_sync(spec, exc)
        return _CreateOutcome(
            handle=Handle(spec.name, spec.nonce, self.name, uid=pod.metadata.uid),
            stored_at=time.monotonic(),
            version=pod.metadata.resource_version or "",
        )

    def _conflict_sync(self, spec: SandboxSpec, exc: ApiException) -> _CreateOutcome:
        extra: dict[str, Any] = {"name": spec.name, "nonce": spec.nonce, "status": 409}
        try:
            holder = self.core.read_namespaced_pod(
                spec.name, self.config.namespace, _request_timeout=self.config.request_timeout_s
            )
        except (ApiException, *TRANSPORT_ERRORS):
            holder = None
        if (
            holder is not None
            and (holder.metadata.annotations or {}).get(L.NONCE_ANNOTATION) == spec.nonce
        ):
            return _CreateOutcome(
                handle=Handle(spec.name, spec.nonce, self.name, uid=holder.metadata.uid)
            )
        extra["holder_uid"] = holder.metadata.uid if holder is not None else None
        return _CreateOutcome(
            error=_err(
                ProviderConflict,
                f"pod {spec.name} is held by another workload; left alone",
                extra,
                exc,
            )
        )

    def _reclaim_sync(self, spec: SandboxSpec, cause: BaseException) -> _CreateOutcome:
        """Ambiguous answer: read back by name, delete only on our nonce (UID precondition)."""
        extra: dict[str, Any] = {
            "name": spec.name,
            "nonce": spec.nonce,
            "namespace": self.config.namespace,
            "cause": _describe(cause),
        }
        message = f"create of pod {spec.name} ended ambiguously ({_describe(cause)})"
        try:
            pod = self.core.read_namespaced_pod(
                spec.name, self.config.namespace, _request_timeout=self.config.request_timeout_s
            )
        except ApiException as exc:
            if exc.status == 404:
                extra.update(stored=False, reclaimed=False)
                return _CreateOutcome(
                    error=_err(ProviderAmbiguous, message + "; not stored", extra, cause)
                )
            pod, read_error = None, exc
        except TRANSPORT_ERRORS as exc:
            pod, read_error = None, exc
        if pod is None:  # cannot tell: own it by name and nonce until a read settles it
            extra.update(
                stored=None, reclaimed=False, pending_delete=True, read_error=_describe(read_error)
            )
            pending = PendingDelete(spec.name, "", spec.nonce, last_error=_describe(read_error))
            return _CreateOutcome(
                error=_err(ProviderAmbiguous, message + "; read-back failed", extra, cause),
                pending=pending,
            )
        if (pod.metadata.annotations or {}).get(L.NONCE_ANNOTATION) != spec.nonce:
            extra.update(stored=False, reclaimed=False, held_by_other=pod.metadata.uid)
            return _CreateOutcome(
                error=_err(
                    ProviderAmbiguous, message + "; the name is another workload's", extra, cause
                )
            )
        uid = pod.metadata.uid
        extra.update(stored=True, uid=uid)
        try:
            self._delete_sync(spec.name, uid)
        except _Unconfirmed as exc:
            extra.update(reclaimed=False, pending_delete=True)
            pending = PendingDelete(spec.name, uid, spec.nonce, last_error=str(exc))
            return _CreateOutcome(
                error=_err(ProviderAmbiguous, message + "; delete pending", extra, cause),
                pending=pending,
            )
        extra.update(reclaimed=True)
        return _CreateOutcome(
            error=_err(ProviderAmbiguous, message + "; stored pod deleted", extra, cause),
            deleted=(spec.name, uid),
        )

    # --- delete ---------------------------------------------------------------------------
    def _delete_sync(self, name: str, uid: str, resource: str = "pods") -> str:
        """One delete with a UID precondition. Returns how it was confirmed, or raises."""
        body = client.V1DeleteOptions(
            preconditions=client.V1Preconditions(uid=uid) if uid else None,
            propagation_policy="Background",
        )
        call = (
            self.core.delete_namespaced_pod
            if resource == "pods"
            else self.core.delete_namespaced_config_map
        )
        try:
            call(
                name,
                self.config.namespace,
                body=body,
                _request_timeout=self.config.request_timeout_s,
            )
        except ApiException as exc:
            if exc.status == 404:
                return "gone"
            if exc.status == 409 and uid:
                return "replaced"  # the name now holds someone else's object: ours is gone
            raise _Unconfirmed(_describe(exc)) from exc
        except TRANSPORT_ERRORS as exc:
            raise _Unconfirmed(_describe(exc)) from exc
        return "deleted"

    def _delete_pending_sync(self, entry: PendingDelete) -> str:
        uid = entry.uid
        if not uid:  # only the name is known: read it back and check the nonce first
            try:
                pod = self.core.read_namespaced_pod(
                    entry.name,
                    self.config.namespace,
                    _request_timeout=self.config.request_timeout_s,
                )
            except ApiException as exc:
                if exc.status == 404:
                    return "gone"
                raise _Unconfirmed(_describe(exc)) from exc
            except TRANSPORT_ERRORS as exc:
                raise _Unconfirmed(_describe(exc)) from exc
            nonce = (pod.metadata.annotations or {}).get(L.NONCE_ANNOTATION)
            managed = (pod.metadata.labels or {}).get(L.MANAGED_BY) == L.VALUE_MANAGED_BY
            # Without a nonce (a handle rebuilt from a listing) our label must be there.
            if (nonce != entry.nonce) if entry.nonce else not managed:
                return "not_ours"
            uid = pod.metadata.uid
        return self._delete_sync(entry.name, uid)

    def _add_pending(self, entry: PendingDelete) -> None:
        if entry.name not in self._pending:
            self._pending[entry.name] = entry
            self._hook(self.on_pending, entry)
        if self.config.retry_pending_in_background and not self._closed:
            if self._retrier is None or self._retrier.done():
                self._retrier = self._spawn(self._retry_pending())

    def _confirm(self, name: str, uid: str) -> None:
        self._pending.pop(name, None)
        if name in self._stored and self._stored[name][0] in ("", uid):
            del self._stored[name]
        self._hook(self.on_deleted, name, uid)

    async def destroy(self, handle: Handle) -> None:
        self._ensure_started()
        entry = PendingDelete(handle.name, handle.uid, handle.nonce)
        last = ""
        try:
            for attempt in range(max(1, self.config.destroy_attempts)):
                if attempt:
                    await self._sleep(self._backoff(attempt - 1))
                try:
                    await self._in_thread("delete", handle.name, self._delete_pending_sync, entry)
                except _Unconfirmed as exc:
                    last = str(exc)
                    self._add_pending(replace(entry, attempts=attempt + 1, last_error=last))
                    continue
                self._confirm(handle.name, handle.uid)
                return
        except asyncio.CancelledError:
            self._add_pending(entry)  # the delete may be in flight: keep owning the pod
            raise
        raise ProviderError(
            f"delete of pod {handle.name} not confirmed ({last}); kept pending",
            {"name": handle.name, "uid": handle.uid, "pending": True, "last_error": last},
        )

    def pending_deletes(self) -> list[PendingDelete]:
        return list(self._pending.values())

    def add_pending(self, name: str, uid: str, nonce: str) -> None:
        """Adopt a pending delete recorded elsewhere (the pool's table after a restart)."""
        self._ensure_started()
        self._add_pending(PendingDelete(name, uid, nonce))

    async def flush_pending(self) -> int:
        """Try every pending delete once; returns how many were confirmed."""
        self._ensure_started()
        confirmed = 0
        for entry in list(self._pending.values()):
            try:
                await self._in_thread("delete", entry.name, self._delete_pending_sync, entry)
            except _Unconfirmed as exc:
                if entry.name in self._pending:
                    self._pending[entry.name] = replace(
                        entry, attempts=entry.attempts + 1, last_error=str(exc)
                    )
                continue
            self._confirm(entry.name, entry.uid)
            confirmed += 1
        return confirmed

    async def _retry_pending(self) -> None:
        attempt = 0
        while self._pending and not self._closed:
            await self._sleep(self._backoff(attempt))
            attempt = 0 if await self.flush_pending() else attempt + 1

    # --- readiness, health, listing ----------------------------------------------------------
    async def wait_ready(self, handle: Handle, budget_s: float) -> ReadyInfo:
        loop = self._ensure_started()
        deadline = loop.time() + budget_s
        waiter = _Waiter(handle.name, handle.uid, loop.create_future())
        self._waiters.setdefault(handle.name, []).append(waiter)
        self._evaluate(handle.name)
        try:
            pod = await asyncio.wait_for(waiter.future, budget_s)
        except TimeoutError as exc:
            cached = self._cache.get(handle.name)
            phase = _status(cached).get("phase") if cached is not None else None
            raise SandboxNotReady(
                f"pod {handle.name} not Ready within {budget_s:g}s",
                {"name": handle.name, "uid": handle.uid, "phase": phase, "reason": "budget"},
            ) from exc
        finally:
            waiters = self._waiters.get(handle.name, [])
            if waiter in waiters:
                waiters.remove(waiter)
            if not waiters:
                self._waiters.pop(handle.name, None)
        info = ready_info(pod, self.config)
        while self.config.verify_health and not await self.health(handle, info.address, ""):
            if loop.time() >= deadline:
                raise SandboxNotReady(
                    f"execd of pod {handle.name} did not answer at {info.address}",
                    {
                        "name": handle.name,
                        "uid": handle.uid,
                        "address": info.address,
                        "reason": "health",
                    },
                )
            await asyncio.sleep(min(0.2, max(0.0, deadline - loop.time())))
        return info

    async def health(self, handle: Handle, address: str, token: str) -> bool:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.config.health_timeout_s)
            )
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            async with self._http.get(f"http://{address}/health", headers=headers) as resp:
                if resp.status != 200:
                    return False
                body = await resp.json(content_type=None)
                return bool(body.get("ok", True)) if isinstance(body, dict) else True
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return False

    async def list_owned(self) -> list[OwnedSandbox]:
        self._ensure_started()
        try:
            pods = await self._in_thread(
                "list",
                "",
                lambda: self.core.list_namespaced_pod(
                    self.config.namespace,
                    label_selector=SELECTOR,
                    _request_timeout=self.config.request_timeout_s,
                ),
            )
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise ProviderError(f"listing Sandman's pods failed: {_describe(exc)}") from exc
        owned = []
        for pod in pods.items:
            meta, labels = pod.metadata, pod.metadata.labels or {}
            job = labels.get(L.JOB, "")
            owned.append(
                OwnedSandbox(
                    name=meta.name,
                    uid=meta.uid,
                    nonce=(meta.annotations or {}).get(L.NONCE_ANNOTATION, ""),
                    job_id=int(job) if job.isdigit() else None,
                    role=labels.get(L.ROLE, ""),
                    phase=pod.status.phase if pod.status else "",
                    created=meta.creation_timestamp,
                )
            )
        return owned

    # --- per-job anchor ---------------------------------------------------------------------
    @staticmethod
    def anchor_name(job_id: int) -> str:
        return f"sandman-job-{job_id}"

    async def ensure_anchor(self, job_id: int) -> OwnerRef:
        """The job's anchor ConfigMap (created once); pods name it as their owner."""
        self._ensure_started()
        name = self.anchor_name(job_id)
        body = client.V1ConfigMap(
            api_version="v1",
            kind="ConfigMap",
            metadata=client.V1ObjectMeta(
                name=name, labels={L.MANAGED_BY: L.VALUE_MANAGED_BY, L.JOB: str(job_id)}
            ),
            data={"job": str(job_id)},
        )

        def ensure() -> client.V1ConfigMap:
            ns, timeout = self.config.namespace, self.config.request_timeout_s
            try:
                return self.core.create_namespaced_config_map(ns, body, _request_timeout=timeout)
            except ApiException as exc:
                if exc.status != 409:
                    raise
            return self.core.read_namespaced_config_map(name, ns, _request_timeout=timeout)

        try:
            anchor = await self._in_thread("anchor", name, ensure)
        except (ApiException, *TRANSPORT_ERRORS) as exc:
            raise ProviderError(
                f"anchor {name} could not be ensured: {_describe(exc)}", {"job_id": job_id}
            ) from exc
        return OwnerRef(kind=L.ANCHOR_KIND, name=name, uid=anchor.metadata.uid)

    async def delete_anchor(self, job_id: int) -> None:
        """Delete the job's anchor; the garbage collector then deletes every pod it owns."""
        self._ensure_started()
        name = self.anchor_name(job_id)
        for attempt in range(max(1, self.config.destroy_attempts)):
            if attempt:
                await self._sleep(self._backoff(attempt - 1))
            try:
                await self._in_thread("delete", name, self._delete_sync, name, "", "configmaps")
                return
            except _Unconfirmed as exc:
                last = str(exc)
        raise ProviderError(f"delete of anchor {name} not confirmed ({last})", {"job_id": job_id})

    # --- shutdown ---------------------------------------------------------------------------
    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._retrier is not None:
            self._retrier.cancel()
        settling = [t for t in self._tasks if t is not self._retrier]
        if settling:  # abandoned creates still own pods: let them finish their delete
            await asyncio.wait(settling, timeout=self.config.request_timeout_s * 2)
        if self.informer is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.informer.stop)
        for waiters in self._waiters.values():
            for waiter in waiters:
                if not waiter.future.done():
                    waiter.future.set_exception(
                        SandboxNotReady("the provider closed", {"name": waiter.name})
                    )
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)
        if self._http is not None:
            await self._http.close()
        if self._owns_client:
            self.api_client.close()
