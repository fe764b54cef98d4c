"""``StandinCluster``: the stand-in Kubernetes API, scheduler and kubelet in one object.

Start it in a background thread with its own event loop (``start()`` returns the base
URL) from tests and benchmarks, or inside a running loop with ``await start_async()``
(the ``standin_cluster`` command). The in-process API below is what an independent
auditor uses: it reads the store directly, never through the client under test.

The same public methods are the control API that ``control.py`` serves under
``/_standin/`` (``state()``, ``pods()``, ``nodes()``, ``address_failures()``,
``request_totals()``, ``subnets()``, ``put_pod()``, plus the ``gates``, ``plans``, ``api``,
``store`` and ``sim`` collaborators); nothing outside this module calls a private method of it.

Invariants: every public method is safe to call from any thread (work is marshalled onto
the cluster's loop -- or run at once when called on it -- and results are deep copies);
``stop()`` releases all gates, ends all watches, cancels held requests, stops every execd
and waits for it -- a test that started a cluster and calls ``stop()`` in ``finally``
leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from standin import control
from standin.disruptions import Disruptions
from standin.events import EventLog
from standin.execd_runner import ExecdRunner
from standin.gates import GateRegistry
from standin.gc import GarbageCollector
from standin.kubeconfig import write_kubeconfig
from standin.kubelet import Kubelet, Timings, prepare_pod
from standin.leases import LeaseApi
from standin.plans import PlanRegistry
from standin.scheduler import AddressModel, NodeSpec, Scheduler, attach_subnets, make_nodes
from standin.server import ApiServer
from standin.sim import Simulation
from standin.stats import RequestStats
from standin.status import rfc3339
from standin.store import Listener, Store
from standin.subnets import Subnet, SubnetSpec, describe_subnets
from standin.termination import Terminator

T = TypeVar("T")


def _copy(value: T) -> T:
    return json.loads(json.dumps(value))


class StandinCluster:
    def __init__(
        self,
        nodes: int | list[NodeSpec] = 3,
        *,
        mode: str = "virtual",
        speed: float = 1.0,
        seed: int = 0,
        timings: Timings | None = None,
        address_model: AddressModel | None = None,
        subnets: list[SubnetSpec] | None = None,
        warm_ip_target: int = 1,
        images: Mapping[str, int] | None = None,
        default_image_bytes: int = 43_000_000,
        run_execd: bool = False,
        execd_python: str = sys.executable,
        execd_pythonpath: str | None = None,
        history_limit: int = 1000,
        gone_mode: str = "event",
        bookmark_interval_s: float | None = None,
        gc_absent_owners: bool = True,
        event_ttl_s: float = 3600.0,
        host: str = "127.0.0.1",
        port: int = 0,
        epoch: dt.datetime | None = None,
    ) -> None:
        if gone_mode not in ("event", "http"):
            raise ValueError(
                "gone_mode is 'event' (ERROR event, as the API server) or 'http' (410)"
            )
        self._nodes_arg, self.mode, self.speed, self.seed = nodes, mode, speed, seed
        self.timings = timings or Timings()
        self.address_model = address_model or AddressModel()
        # The VPC CNI address model (subnets.py): none given, pods' addresses are unbounded.
        self._subnet_specs, self.warm_ip_target = list(subnets or []), warm_ip_target
        self.subnet_states: list[Subnet] = []
        self.images = dict(images or {})
        self.default_image_bytes = default_image_bytes
        self.run_execd = run_execd
        self._execd_args = (execd_python, execd_pythonpath)
        self.history_limit, self.gone_mode = history_limit, gone_mode
        self.bookmark_interval_s = bookmark_interval_s
        self.gc_absent_owners = gc_absent_owners
        self.event_ttl_s = event_ttl_s
        self.host, self.port, self._epoch = host, port, epoch
        self.gates = GateRegistry()
        self.plans = PlanRegistry()
        self.stats = RequestStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._loop_thread_id: int | None = None
        self._runner: web.AppRunner | None = None
        self._driver: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def started(self) -> bool:
        """True once :meth:`start` or :meth:`start_async` has run (also after a stop)."""
        return self._loop is not None

    # --- lifecycle ------------------------------------------------------------------------
    def start(self) -> str:
        """Serve from a background thread with its own loop; return the base URL."""
        if self._thread is not None:
            return self.url
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start_async())
            except BaseException as exc:  # reported to the starting thread
                failure.append(exc)
                ready.set()
                loop.close()
                return
            ready.set()
            try:
                loop.run_forever()
            finally:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self._thread = threading.Thread(target=main, name="standin-cluster", daemon=True)
        self._thread.start()
        ready.wait()
        if failure:
            self._thread.join()
            self._thread = None
            raise failure[0]
        return self.url

    def stop(self) -> None:
        if self._thread is None or self._loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.stop_async(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=60)
        self._thread = None

    def __enter__(self) -> StandinCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def start_async(self) -> str:
        """Serve from the running loop (the CLI). Pair with :meth:`stop_async`."""
        self._loop = asyncio.get_running_loop()
        self._loop_thread_id = threading.get_ident()
        self.sim = Simulation(self.mode, speed=self.speed, epoch=self._epoch)
        self.store = Store(
            now=lambda: rfc3339(self.sim.datetime()),
            history_limit=self.history_limit,
            rng=random.Random(self.seed + 1),
        )
        self.events_log = EventLog(
            lambda: self.sim.now,
            self.sim.datetime,
            store=Store(now=lambda: rfc3339(self.sim.datetime()), rng=random.Random(self.seed + 2)),
            ttl_s=self.event_ttl_s,
        )
        # A block of its own per cluster: parallel clusters on one host never share pod
        # addresses (their real execds bind podIP:port).
        pod_range = random.SystemRandom().randrange(1, 256 * 256 - 1)
        self.scheduler = Scheduler(make_nodes(self._nodes_arg, pod_range=pod_range))
        if self._subnet_specs:
            self.subnet_states = attach_subnets(
                self.scheduler.nodes, self._subnet_specs, warm_ip_target=self.warm_ip_target
            )
        python, pythonpath = self._execd_args
        self.execd = ExecdRunner(python=python, pythonpath=pythonpath) if self.run_execd else None
        self.kubelet = Kubelet(
            store=self.store,
            sim=self.sim,
            scheduler=self.scheduler,
            plans=self.plans,
            gates=self.gates,
            events=self.events_log,
            rng=random.Random(self.seed),
            timings=self.timings,
            address_model=self.address_model,
            images=self.images,
            default_image_bytes=self.default_image_bytes,
            execd=self.execd,
        )
        self.terminator = Terminator(store=self.store, sim=self.sim)
        self.gc = GarbageCollector(
            store=self.store,
            sim=self.sim,
            events=self.events_log,
            delay_s=self.timings.gc_s,
            absent_owners=self.gc_absent_owners,
            delete=lambda resource, ns, name, uid: self.terminator.delete(
                resource, ns, name, uid=uid
            ),
        )
        self.store.listeners += [self.kubelet, self.gc]
        self.disruptions = Disruptions(
            store=self.store,
            kubelet=self.kubelet,
            events=self.events_log,
            when=lambda: rfc3339(self.sim.datetime()),
        )
        self.api = ApiServer(
            store=self.store,
            gates=self.gates,
            plans=self.plans,
            stats=self.stats,
            gone_mode=self.gone_mode,
            bookmark_interval_s=self.bookmark_interval_s,
            precise_now=lambda: rfc3339(self.sim.datetime(), precise=True),
            terminator=self.terminator,
            schedule=self.sim.after,
            events=self.events_log,
        )
        app = web.Application(client_max_size=16 * 2**20)
        self.api.routes(app)
        self.leases = LeaseApi(now=lambda: rfc3339(self.sim.datetime()), stats=self.stats)
        self.leases.routes(app)
        control.add_routes(app, self)
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=2.0
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])  # the port picked for port=0
        self._driver = self._loop.create_task(self.sim.run())
        return self.url

    async def stop_async(self) -> None:
        self.gates.release_all()
        self.store.close_watches()
        self.api.cancel_hanging()
        if self._driver is not None:
            self._driver.cancel()
            await asyncio.gather(self._driver, return_exceptions=True)
        await self.sim.stop()
        if self.execd is not None:
            await self.execd.stop_all()
        await self.kubelet.close()
        if self._runner is not None:
            await self._runner.cleanup()

    # --- marshalling ----------------------------------------------------------------------
    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        if self._loop is None:
            raise RuntimeError("the stand-in cluster is not started")
        if threading.get_ident() == self._loop_thread_id:
            return fn(*args)

        async def run() -> T:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout=30)

    # --- in-process API (any thread) ------------------------------------------------------
    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """Snapshot of the pod store (the auditor's view, independent of any client)."""
        return self._call(self._pods, namespace)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._call(lambda: _copy(self.store.get("pods", namespace, name)))

    def configmaps(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return self._call(lambda: _copy(list(self.store.items("configmaps", namespace))))

    def secrets(self, namespace: str | None = None) -> list[dict[str, Any]]:
        return self._call(lambda: _copy(list(self.store.items("secrets", namespace))))

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Snapshot of one coordination.k8s.io/v1 Lease (``standin/leases.py``)."""
        return self._call(lambda: _copy(self.leases.lease(namespace, name)))

    def lease_writes(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """Every stored version of one Lease, oldest first, with the watch streams open
        when it was written (``LeaseApi.writes``)."""
        return self._call(lambda: _copy(self.leases.writes(namespace, name)))

    def nodes(self) -> list[dict[str, Any]]:
        return self._call(self._nodes)

    def events(self) -> list[dict[str, Any]]:
        return self._call(lambda: _copy(self.events_log.list()))

    def address_failures(self) -> dict[str, Any]:
        return self._call(self._address_failures)

    def subnets(self) -> dict[str, Any]:
        """The VPC's subnets as EC2 ``DescribeSubnets`` answers (``{"Subnets": [...]}``)."""
        return self._call(lambda: _copy(describe_subnets(self.subnet_states)))

    def consume_addresses(self, subnet_id: str, count: int) -> int:
        """Another workload takes ``count`` addresses of a subnet (negative: gives back);
        returns the subnet's available count. Unknown subnet: KeyError."""

        def consume() -> int:
            for subnet in self.subnet_states:
                if subnet.spec.id == subnet_id:
                    return subnet.consume(count)
            raise KeyError(subnet_id)

        return self._call(consume)

    def request_counts(self) -> Counter[tuple[str, str]]:
        """Requests by (verb, resource): verbs create/get/list/watch/patch/delete."""
        return self.stats.snapshot()

    def request_totals(self) -> dict[str, int]:
        """Requests as ``{"<verb> <resource>": n}`` (the JSON form of the counts)."""
        return self._call(self._request_counts)

    def state(self) -> dict[str, Any]:
        """Everything at once: sim time, store, nodes, events, failures, requests, watches."""
        return self._call(self._state)

    def requests_log(self) -> list[dict[str, Any]]:
        return self._call(lambda: _copy(self.stats.log))

    def put_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Store a pod directly (another workload's), bypassing plans, gates and counts."""
        return self._call(self._put_pod, namespace, body)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Remove a pod at once, as a force delete (grace 0) by another actor would."""
        self._call(self.store.delete, "pods", namespace, name)

    def partition_node(self, name: str) -> None:
        """Cut the node's kubelet off the API: its Terminating pods stay Terminating."""
        self._call(self.terminator.partition, name)

    def heal_node(self, name: str) -> int:
        """Reconnect the node's kubelet; returns how many pod kills it resumes."""
        return self._call(self.terminator.heal, name)

    def evict_pod(self, namespace: str, name: str) -> bool:
        """Node-pressure eviction of a pod (``disruptions.py``)."""
        return self._call(self.disruptions.evict, namespace, name)

    def lose_node(self, node: str) -> int:
        """The node stops reporting: Ready Unknown, its pods Ready False."""
        return self._call(self.disruptions.lose_node, node)

    def fail_probe(self, namespace: str, name: str) -> bool:
        """The pod's readiness probe starts failing: Ready flips back to False."""
        return self._call(self.disruptions.fail_probe, namespace, name)

    def add_store_listener(self, listener: Listener) -> None:
        """Tell ``listener`` of every create and delete in the store from now on."""
        self._call(self.store.listeners.append, listener)

    def step(self) -> bool:
        return self._call(self.sim.step)

    def advance(self, seconds: float) -> int:
        return self._call(self.sim.advance, seconds)

    def run_until_idle(self, timeout: float = 60.0) -> int:
        """Manual mode: run every queued stage (and the tasks they start) to the end."""
        if self._loop is None:
            raise RuntimeError("the stand-in cluster is not started")
        fut = asyncio.run_coroutine_threadsafe(self.sim.run_until_idle(), self._loop)
        return fut.result(timeout=timeout)

    def sim_time(self) -> float:
        return self._call(lambda: self.sim.now)

    def bookmark(self) -> int:
        """Send a BOOKMARK to every watch that allowed them; returns how many."""
        return self._call(self.api.bookmark_all)

    def compact_history(self) -> int:
        """Forget watch history: a watch resuming from before now gets 410."""
        self._call(self.store.compact)
        return self.store.compacted_rv

    def close_watches(self) -> int:
        """End every open watch stream (clients then resume from their last version)."""
        return self._call(self.store.close_watches)

    def wait_for_watchers(self, n: int, timeout: float = 30.0, *, exact: bool = False) -> bool:
        """Block until ``n`` watch streams are open (``exact``: exactly ``n``)."""
        return self.stats.wait_watching(n, timeout, exact=exact)

    def write_kubeconfig(self, path: str | Path, namespace: str = "default") -> Path:
        return write_kubeconfig(path, self.url, namespace=namespace)

    # --- loop-side implementations --------------------------------------------------------
    def _pods(self, namespace: str | None) -> list[dict[str, Any]]:
        items, _ = self.store.list("pods", namespace)
        return _copy(items)

    def _nodes(self) -> list[dict[str, Any]]:
        return [n.summary() for n in self.scheduler.nodes]

    def _address_failures(self) -> dict[str, Any]:
        by_node = {n.name: n.address_failures for n in self.scheduler.nodes}
        return {
            "total": sum(by_node.values()),
            "by_node": by_node,
            "by_pod": dict(self.kubelet.address_failures_by_pod),
        }

    def _request_counts(self) -> dict[str, int]:
        return {f"{verb} {resource}": n for (verb, resource), n in self.stats.snapshot().items()}

    def _put_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return _copy(self.store.create("pods", namespace, prepare_pod(_copy(body))))

    def _state(self) -> dict[str, Any]:
        return {
            "sim_time": self.sim.now,
            "mode": self.mode,
            "pods": self._pods(None),
            "configmaps": _copy(list(self.store.items("configmaps"))),
            "nodes": self._nodes(),
            "events": _copy(self.events_log.list()),
            "event_counts": dict(self.events_log.counts),
            "address_failures": self._address_failures(),
            "subnets": _copy(describe_subnets(self.subnet_states))["Subnets"],
            "requests": self._request_counts(),
            "watches": self.stats.watching,
            "resource_version": self.store.rv,
        }
