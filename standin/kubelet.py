"""Simulated kubelet and scheduling loop of the stand-in cluster (the GC is ``gc.py``).

Stage order for every pod, each stage one simulation event:

    created -> scheduled (PodScheduled) -> address assigned (retried on failure, §5.2)
    -> image pulled or present (node cache; time from the image size, §5.3)
    -> started (Initialized, phase Running) -> readiness probe (gate ``probe``; with
    ``run_execd`` the container's own ``readinessProbe``) -> Ready (gate ``ready``;
    ContainersReady, Ready)

Pod IPs come from the node's pod range (``Scheduler``; never 127.0.0.1). With
``run_execd`` the containers are real processes started from the pod's spec
(``execd_runner.py``), and the readiness probe is the spec's: an ``httpGet`` to
``podIP:port`` + ``path`` (a named port resolved through the container's ports), success
for a status from 200 to 399; no ``readinessProbe`` means Ready once started. A main
container that exits fails the pod (``restartPolicy: Never``).

Invariants: every stage re-reads the pod and stops if it is gone or was replaced by a pod
with another uid; what a stage did is told only the way a cluster tells it -- the pod's
conditions and status (whole seconds, as the API server writes) and core/v1 Events with
the scheduler's and kubelet's reasons and messages (``events.py``; formats of
kube-scheduler's ``schedule_one.go`` and the kubelet's ``images/image_manager.go`` and
``kuberuntime_container.go``). The pod carries no stand-in-only stamps. Pod plans
``fail_start`` / ``never_ready`` are taken once per pod at the start stage.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from standin import keys as K
from standin.events import SCHEDULER, EventLog, go_duration
from standin.execd_runner import ExecdRunner, ExecdStartError
from standin.gates import GateContext, GateRegistry
from standin.plans import PlanRegistry
from standin.podstatus import (
    main_container,
    mark_failed,
    mark_ready,
    mark_running,
    prepare_pod,
    set_condition,
)
from standin.pullfail import FailingPull
from standin.scheduler import AddressModel, Scheduler
from standin.sim import Simulation
from standin.status import rfc3339
from standin.store import Obj, Store

__all__ = ["Kubelet", "PodSim", "Timings", "prepare_pod"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Timings:
    """Simulated seconds each stage takes (plausible for a cached 43 MB image, §5.2)."""

    schedule_s: float = 0.05
    address_s: float = 0.3
    address_retry_s: float = 2.0
    pull_latency_s: float = 0.5
    pull_bytes_per_s: float = 80e6
    init_s: float = 0.2
    start_s: float = 0.5
    probe_delay_s: float = 1.0
    probe_period_s: float = 1.0
    gc_s: float = 0.5


@dataclass
class PodSim:
    uid: str
    namespace: str
    name: str
    node: str | None = None
    unschedulable_noted: bool = False
    gated: bool = False
    address_failures: int = 0
    image_present: bool | None = None
    pull_ms: float | None = None
    pulled_at: float | None = None
    outcome: str | None = None
    execd_key: str | None = None
    process: bool = False  # a real main-container process runs (``run_execd``)
    probes: int = 0
    done: bool = False


class Kubelet:
    def __init__(
        self,
        *,
        store: Store,
        sim: Simulation,
        scheduler: Scheduler,
        plans: PlanRegistry,
        gates: GateRegistry,
        events: EventLog,
        rng: random.Random,
        timings: Timings,
        address_model: AddressModel,
        images: Mapping[str, int],
        default_image_bytes: int,
        execd: ExecdRunner | None,
    ) -> None:
        self.store, self.sim, self.scheduler = store, sim, scheduler
        self.plans, self.gates, self.events, self.rng = plans, gates, events, rng
        self.timings, self.address_model = timings, address_model
        self.images, self.default_image_bytes = dict(images), default_image_bytes
        self.execd = execd
        self.sims: dict[str, PodSim] = {}
        self.address_failures_by_pod: dict[str, int] = {}
        self._pass_pending = False
        self._http: aiohttp.ClientSession | None = None
        self._keys: dict[str, PodSim] = {}  # runner key -> pod, for container exits
        if execd is not None:
            execd.on_exit = self._container_exited

    # --- helpers ----------------------------------------------------------------------------
    def _when(self, t: float | None = None) -> str:
        return rfc3339(self.sim.datetime(t))

    def _current(self, s: PodSim) -> Obj | None:
        pod = self.store.get("pods", s.namespace, s.name)
        if pod is None or pod["metadata"]["uid"] != s.uid or s.done:
            return None
        if pod["metadata"].get("deletionTimestamp"):
            return None  # Terminating: no stage moves it forward any more
        return pod

    def _update(self, s: PodSim, mutate: Any) -> Obj | None:
        return self.store.update("pods", s.namespace, s.name, mutate)

    def _ctx(self, point: str, pod: Obj) -> GateContext:
        meta = pod["metadata"]
        return GateContext(
            point, point, "pods", meta["namespace"], meta["name"], dict(meta.get("labels") or {})
        )

    # --- store listener -------------------------------------------------------------------
    def on_created(self, resource: str, obj: Obj) -> None:
        if resource == "pods":
            meta = obj["metadata"]
            self.sims[meta["uid"]] = PodSim(meta["uid"], meta["namespace"], meta["name"])
            self._kick()

    def on_updated(self, resource: str, obj: Obj, old: Obj) -> None:
        """A gated pod whose ``spec.schedulingGates`` emptied goes back to the scheduler."""
        s = self.sims.get(obj["metadata"]["uid"]) if resource == "pods" else None
        if s is not None and s.gated and not (obj.get("spec") or {}).get("schedulingGates"):
            s.gated = False
            self._kick()

    def stop(self, uid: str, *, release: bool = True) -> str | None:
        """Stop simulating pod ``uid`` (a disruption took it over); returns its node.
        ``release`` frees its place on the node (not for a node that is unreachable)."""
        s = self.sims.get(uid)
        if s is None:
            return None
        s.done = True
        if release:
            self.scheduler.release(s.node, uid)
        return s.node

    def on_deleted(self, resource: str, obj: Obj) -> None:
        uid = obj["metadata"]["uid"]
        if resource != "pods":
            return
        s = self.sims.pop(uid, None)
        if s is None:
            return
        s.done = True
        self.scheduler.release(s.node, uid)
        if s.node is not None:
            name = main_container(obj).get("name", "sandbox")
            self.events.add(
                "Killing",
                obj,
                f"Stopping container {name}",
                node=s.node,
                field_path=f"spec.containers{{{name}}}",
            )
        if s.execd_key and self.execd is not None:
            self._keys.pop(s.execd_key, None)
            self.sim.spawn(self.execd.stop(s.execd_key))
        if any(p.node is None for p in self.sims.values()):
            self._kick()

    # --- scheduling -------------------------------------------------------------------------
    def _kick(self) -> None:
        if not self._pass_pending:
            self._pass_pending = True
            self.sim.after(self.timings.schedule_s, self._schedule_pass)

    def _schedule_pass(self) -> None:
        self._pass_pending = False
        for s in list(self.sims.values()):
            if s.node is None and not s.done:
                self._schedule_one(s)

    def _schedule_one(self, s: PodSim) -> None:
        pod = self._current(s)
        if pod is None or pod.get("status", {}).get("phase") != "Pending":
            return
        when = self._when()
        if (pod.get("spec") or {}).get("schedulingGates"):
            # Pod scheduling readiness: a gated pod is not tried until its gates are gone.
            if not s.gated:
                s.gated = True
                text = "Scheduling is blocked due to non-empty scheduling gates"
                self._update(s, lambda p: _unscheduled(p, when, "SchedulingGated", text))
            return
        node = self.scheduler.pick(pod)
        if node is None:
            if not s.unschedulable_noted:
                s.unschedulable_noted = True
                n = len(self.scheduler.nodes)
                text = (
                    f"0/{n} nodes are available: {n} Insufficient cpu. preemption: 0/{n} nodes"
                    f" are available: {n} No preemption victims found for incoming pod."
                )
                self._update(s, lambda p: _unscheduled(p, when, "Unschedulable", text))
                self.events.add("FailedScheduling", pod, text, type="Warning", component=SCHEDULER)
            return
        s.node = node.name
        self.scheduler.bind(node, pod, self.sim.now)

        def bound(p: Obj) -> None:
            p["spec"]["nodeName"] = node.name
            set_condition(p["status"], "PodScheduled", True, when)

        self._update(s, bound)
        message = f"Successfully assigned {s.namespace}/{s.name} to {node.name}"
        self.events.add("Scheduled", pod, message, component=SCHEDULER)
        self.sim.after(self.timings.address_s, self._assign_address, s)

    # --- address, image, start --------------------------------------------------------------
    def _assign_address(self, s: PodSim) -> None:
        pod = self._current(s)
        node = self.scheduler.node(s.node or "")
        if pod is None or node is None:
            return
        recent = node.recent_binds(self.sim.now, self.address_model.window_s)
        # No address left in the node's subnet (subnets.py) fails without a draw, so the
        # seeded failures of a cluster without subnets stay as they were.
        exhausted = node.addresses is not None and not node.addresses.assign(s.uid)
        if exhausted or self.rng.random() < self.address_model.failure_probability(recent):
            if not exhausted and node.addresses is not None:
                node.addresses.release(s.uid)  # a failed attempt holds no address
            s.address_failures += 1
            node.address_failures += 1
            self.address_failures_by_pod[s.name] = s.address_failures
            # A new sandbox id per attempt (hashed: the seeded RNG's draws stay as they were).
            attempt = f"{s.uid}/{s.address_failures}".encode()
            sandbox = hashlib.sha256(attempt).hexdigest()
            self.events.add(
                "FailedCreatePodSandBox",
                pod,
                "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to setup"
                f' network for sandbox "{sandbox}": plugin type="aws-cni" name="aws-cni"'
                " failed (add): add cmd: failed to assign an IP address to container",
                type="Warning",
                node=node.name,
            )
            self.sim.after(self.timings.address_retry_s, self._assign_address, s)
            return
        ip = node.pod_ip(s.uid)
        when = self._when()

        def addressed(p: Obj) -> None:
            st = p["status"]
            st.update(
                podIP=ip,
                podIPs=[{"ip": ip}],
                hostIP=node.ip,
                hostIPs=[{"ip": node.ip}],
                startTime=when,
            )

        self._update(s, addressed)
        self._pull(s, pod, node)

    def _pull(self, s: PodSim, pod: Obj, node: Any) -> None:
        labels = pod["metadata"].get("labels") or {}
        failing = self.plans.take("pod", s.name, labels, frozenset({"bad_image", "carrier_outage"}))
        inits = pod["spec"].get("initContainers") or []
        if failing == "carrier_outage" and inits:
            self._failing_pull(s, node, inits[0], init=True, outage=True)
            return
        for init in inits:  # carrier images: cached
            path, name = f"spec.initContainers{{{init.get('name')}}}", init.get("name")
            present = f'Container image "{init.get("image")}" already present on machine'
            self.events.add("Pulled", pod, present, node=node.name, field_path=path)
            self.events.add(
                "Created", pod, f"Created container: {name}", node=node.name, field_path=path
            )
            self.events.add(
                "Started", pod, f"Started container {name}", node=node.name, field_path=path
            )
        main = main_container(pod)
        if failing == "bad_image":
            self._failing_pull(s, node, main, init=False, outage=False)
            return
        image = main.get("image", "")
        path = f"spec.containers{{{main.get('name', 'sandbox')}}}"
        ann = pod["metadata"].get("annotations") or {}
        size = int(ann.get(K.IMAGE_BYTES) or self.images.get(image) or self.default_image_bytes)
        now = self.sim.now
        ready_at = node.images.get(image)
        if ready_at is not None and ready_at <= now:
            s.image_present, pull_s = True, 0.0
            self.events.add(
                "Pulled",
                pod,
                f'Container image "{image}" already present on machine',
                node=node.name,
                field_path=path,
            )
        else:
            s.image_present = False
            if ready_at is None:
                pull_s = self.timings.pull_latency_s + size / self.timings.pull_bytes_per_s
                node.images[image] = now + pull_s
            else:  # another pod is pulling it: wait for that pull
                pull_s = ready_at - now
            self.events.add(
                "Pulling", pod, f'Pulling image "{image}"', node=node.name, field_path=path
            )
            took = go_duration(pull_s)
            message = (
                f'Successfully pulled image "{image}" in {took} ({took} including waiting).'
                f" Image size: {size} bytes."
            )
            self.sim.after(pull_s, self._pulled, s, message, path)
        s.pull_ms, s.pulled_at = pull_s * 1000.0, now + pull_s
        self.sim.after(pull_s + self.timings.init_s + self.timings.start_s, self._start, s)

    def _failing_pull(
        self, s: PodSim, node: Any, container: dict[str, Any], *, init: bool, outage: bool
    ) -> None:
        FailingPull(
            sim=self.sim,
            events=self.events,
            current=lambda: self._current(s),
            update=lambda mutate: self._update(s, mutate),
            when=self._when,
            node=node.name,
            container=container,
            init=init,
            outage=outage,
        ).start()

    def _pulled(self, s: PodSim, message: str, path: str) -> None:
        pod = self._current(s)
        if pod is not None:
            self.events.add("Pulled", pod, message, node=s.node, field_path=path)

    def _start(self, s: PodSim) -> None:
        pod = self._current(s)
        if pod is None:
            return
        labels = pod["metadata"].get("labels") or {}
        s.outcome = self.plans.take("pod", s.name, labels, frozenset({"fail_start", "never_ready"}))
        if s.outcome == "fail_start":
            self._fail(s, "Error", "the container exited with code 1 while starting (failure plan)")
            return
        if self.execd is None:
            self._mark_running(s)
            return
        self.sim.spawn(self._start_containers(s, pod))

    async def _start_containers(self, s: PodSim, pod: Obj) -> None:
        assert self.execd is not None
        key = f"{s.namespace}.{s.name}.{s.uid[:8]}"
        s.execd_key = key
        self._keys[key] = s

        def secret_data(name: str) -> Any:
            secret = self.store.get("secrets", s.namespace, name)
            return None if secret is None else dict(secret.get("data") or {})

        try:
            s.process = await self.execd.start(key, pod, secret_data)
        except ExecdStartError as exc:
            reason, _, message = str(exc).partition(": ")
            self._fail(s, reason, message)
            await self.execd.stop(key)
            return
        if self._current(s) is None:  # deleted while the containers were starting
            await self.execd.stop(key)
            return
        self._mark_running(s)

    def _container_exited(self, key: str, code: int) -> None:
        s = self._keys.get(key)
        if s is None or self._current(s) is None:
            return
        tail = self.execd.stderr_of(key)[-500:].strip() if self.execd is not None else ""
        message = f"container sandbox exited with code {code}: {tail}".rstrip(": ")
        self._fail(s, "Completed" if code == 0 else "Error", message, code)

    def _mark_running(self, s: PodSim) -> None:
        when = self._when()
        current = self._current(s)
        if current is None:
            return
        name = main_container(current).get("name", "sandbox")
        path = f"spec.containers{{{name}}}"
        # The kubelet records Created and Started before the status manager reports Running.
        self.events.add(
            "Created", current, f"Created container: {name}", node=s.node, field_path=path
        )
        self.events.add(
            "Started", current, f"Started container {name}", node=s.node, field_path=path
        )

        def running(p: Obj) -> None:
            mark_running(p, when)

        if self._update(s, running) is not None:
            self.sim.after(self.timings.probe_delay_s, self._probe, s)

    # --- readiness -------------------------------------------------------------------------
    def _probe(self, s: PodSim) -> None:
        pod = self._current(s)
        if pod is None:
            return
        gate = self.gates.claim(self._ctx("probe", pod))
        target = probe_target(pod) if s.process else None
        if gate is None and target is None:
            self._after_probe(s, True)
        else:
            self.sim.spawn(self._probe_async(s, gate, target))

    async def _probe_async(self, s: PodSim, gate: Any, target: str | None) -> None:
        if gate is not None:
            await gate.wait_released_async()
        ok = True
        if target is not None and s.outcome != "never_ready":
            ok = await self._http_probe(target)
            if not ok:
                await asyncio.sleep(0.05)  # a real process still booting: do not spin
        self._after_probe(s, ok)

    def _after_probe(self, s: PodSim, ok: bool) -> None:
        pod = self._current(s)
        if pod is None:
            return
        s.probes += 1
        if s.outcome == "never_ready":
            return  # stays Running and not Ready; nobody probes it again
        if not ok:
            self.sim.after(self.timings.probe_period_s, self._probe, s)
            return
        gate = self.gates.claim(self._ctx("ready", pod))
        if gate is None:
            self._mark_ready(s)
        else:
            self.sim.spawn(self._ready_after(s, gate))

    async def _ready_after(self, s: PodSim, gate: Any) -> None:
        await gate.wait_released_async()
        self._mark_ready(s)

    def _mark_ready(self, s: PodSim) -> None:
        if self._current(s) is None:
            return
        when = self._when()
        self._update(s, lambda p: mark_ready(p, when))

    async def _http_probe(self, url: str) -> bool:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        try:
            async with self._http.get(url, allow_redirects=False) as resp:
                return 200 <= resp.status < 400
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False

    def _fail(self, s: PodSim, reason: str, message: str, code: int = 1) -> None:
        """The pod ends: phase Failed, or Succeeded when its container exited with 0."""
        when = self._when()

        def failed(p: Obj) -> None:
            mark_failed(p, when, reason, message)
            if code != 1:
                terminated = p["status"]["containerStatuses"][0]["state"]["terminated"]
                terminated["exitCode"] = code
            if code == 0:
                p["status"]["phase"] = "Succeeded"

        pod = self._update(s, failed)
        s.done = True
        self.scheduler.release(s.node, s.uid)
        if pod is not None and code != 0:
            path = f"spec.containers{{{main_container(pod).get('name', 'sandbox')}}}"
            self.events.add("Failed", pod, message, type="Warning", node=s.node, field_path=path)

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


def probe_target(pod: Obj) -> str | None:
    """The URL of the main container's ``readinessProbe.httpGet``, as the kubelet builds it
    (host: the pod IP unless ``host`` is set; a named port resolved through the container's
    ``ports``), or None when it has no httpGet readiness probe."""
    container = main_container(pod)
    http = (container.get("readinessProbe") or {}).get("httpGet")
    if not http:
        return None
    port = http.get("port")
    if isinstance(port, str) and not port.isdigit():
        named = {p.get("name"): p.get("containerPort") for p in container.get("ports") or []}
        port = named.get(port)
    host = http.get("host") or (pod.get("status") or {}).get("podIP") or ""
    path = http.get("path") or "/"
    scheme = str(http.get("scheme") or "HTTP").lower()
    return f"{scheme}://{host}:{port}{path if path.startswith('/') else '/' + path}"


def _unscheduled(pod: Obj, when: str, reason: str, message: str) -> None:
    """PodScheduled False with the scheduler's reason and message."""
    set_condition(pod["status"], "PodScheduled", False, when, reason)
    for cond in pod["status"]["conditions"]:
        if cond["type"] == "PodScheduled":
            cond["message"] = message
