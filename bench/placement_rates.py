#!/usr/bin/env python3
"""Benchmark: create-rate sweep, spread vs default placement, and two jobs bursting at once
(issue 13, item 2; paper §5.2, Figure 3b, Tables A11-A13).

Three parts in one run, each against a fresh stand-in cluster (no execd behind the pods,
``verify_health`` off) with VPC-CNI subnets (``standin/subnets.py``), over a fresh database
(a temp SQLite file, or ``DATABASE_URL`` under ``scripts/with_postgres.py``):

1. ``rate_sweep``: 99 acquires fired at once for one job whose bucket allows ``r`` creates/s
   (burst 1, so the bucket alone paces; cluster bucket 2r), for r in 5, 20, 50, 100, 200,
   through the real controller and Kubernetes provider. ``--standin`` says where the
   stand-in runs: ``process`` (``manage.py standin_cluster``, realtime at speed 1, over
   HTTP: as an API server on another host; ``rate_sweep``) and/or ``thread`` (a
   ``StandinCluster`` in a thread and loop of this process, virtual time;
   ``rate_sweep_thread``), one sweep after the other. Per rate: the achieved create rate
   (least-squares slope over each create's ``create_sent`` time, when it left the pacer;
   beside it the rate of the API's answers, ``api_created_at``), create-to-Ready p50/p99
   (the stand-in's stamps, whole seconds), acquire wait with queue p50/p99, address
   failures, this process's CPU-ms per create, its CPU-seconds per wall second
   (``process_cpu_cores``: the controller, and the stand-in when it is a thread here), and
   the stand-in process's (``standin_cpu_cores``).
2. ``placement``: two batches of 1,000 pods at 10 creates/s (simulated time: the stand-in
   in manual mode, the pods built by the provider's own ``build_pod_manifest``), one WITH
   the soft topology spread (maxSkew 2, ScheduleAnyway, the default) and one WITHOUT
   (the default scheduler's packing). Per batch: address failures (total, pods with >= 1),
   pods per node (max, nodes used), create-to-Ready p50/p99 in simulated seconds, and the
   lowest free addresses of any subnet.
3. ``two_jobs``: two jobs burst at once (300 acquires each, job buckets 15/s each: 30/s
   together) against a cluster-wide bucket of 20/s. The cluster rate is measured over the
   times the creates left the pacer (``create_sent``, least-squares slope) after the
   cluster burst is spent (error vs 20/s, target <= 5 %);
   each job's caps hold: job A's ``max_live`` 250 refuses 50 with ``pod_cap`` and never has
   more than 250 live; job B's concurrent creates (API stored -> Ready) stay <= its
   ``max_creating``. The CI test of the same rule is
   ``sandboxes/tests/test_controller_kubernetes.py::
   test_creates_wait_for_the_cluster_bucket_shared_by_every_job`` (and
   ``test_pacing.py::test_every_create_passes_its_job_bucket_and_the_shared_cluster_bucket``).

Results: ``bench/results/placement_rates.json`` (``--out``).
Usage: ``python bench/placement_rates.py [--parts rate_sweep,placement,two_jobs]
[--standin process,thread] [--rates 5,20,50,100,200] [--out FILE]``
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from k8s_burst import NAMESPACE, StandinProcess, pct, setup_django  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "placement_rates.json"
IMAGE = "registry.example/task/swe-task:1"
SPEC = {"cpu_millis": 100, "memory_bytes": 128 * 2**20, "workspace_bytes": None}
RATES = (5, 20, 50, 100, 200)
NS = "sandman-place"


def quantiles(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50": None if not values else round(pct(values, 0.50) or 0.0, 2),
        "p99": None if not values else round(pct(values, 0.99) or 0.0, 2),
    }


def _parse(ts: str) -> dt.datetime:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))


def subnets() -> list[Any]:
    from standin.subnets import SubnetSpec

    # Three /20s (4,091 usable each): room for every part's pods, as a sized VPC would.
    return [SubnetSpec(f"subnet-{z}", f"10.0.{16 * i}.0/20", f"zone-{z}") for i, z in
            enumerate("abc")]  # fmt: skip


def cluster(nodes: int, *, mode: str = "virtual", seed: int = 1) -> Any:
    from standin import StandinCluster

    c = StandinCluster(nodes=nodes, mode=mode, seed=seed, subnets=subnets(), warm_ip_target=2)
    c.start()
    return c


def controller_for(c: Any, **kw: Any) -> Any:
    from sandboxes.controller import Controller
    from standin.harness.support import k8s_provider

    provider = k8s_provider(c, verify_health=False, max_workers=16, destroy_attempts=3)
    ctl = Controller(provider=provider, sweep_interval_s=0, **kw)
    ctl.start()
    return ctl


def make_job(name: str, **kw: Any) -> Any:
    from django.contrib.auth import get_user_model

    from sandboxes.services import job_create

    owner, _ = get_user_model().objects.get_or_create(username="bench")
    return job_create(owner=owner, name=name, egress="deny", readiness_budget_s=300.0,
                      now=dt.datetime.now(dt.UTC), **kw)  # fmt: skip


def fire(ctl: Any, jobs: list[tuple[int, int]], timeout_s: float) -> list[list[Any]]:
    """``n`` acquires for each (job id, n) at once; results per job (exceptions kept)."""

    async def burst() -> list[list[Any]]:
        groups = [
            asyncio.gather(
                *(
                    ctl.aacquire(
                        job_id=job_id,
                        image=IMAGE,
                        base_commit=None,
                        role="rollout",
                        timeout_s=timeout_s,
                        **SPEC,
                    )
                    for _ in range(n)
                ),
                return_exceptions=True,
            )  # fmt: skip
            for job_id, n in jobs
        ]
        return list(await asyncio.gather(*groups))

    return asyncio.run(burst())


def drain(ctl: Any, job_ids: list[int]) -> None:
    from sandboxes.models import Job

    for job_id in job_ids:
        ctl.drain(job_id=job_id)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if all(Job.objects.get(pk=j).state == "drained" for j in job_ids):
            return
        time.sleep(0.5)  # waiting for an observable state, not a measurement


def pod_times(c: Any, job_id: int) -> list[tuple[dt.datetime, dt.datetime | None]]:
    """(creationTimestamp, Ready time) of the job's pods, from the stand-in's own store
    (whole seconds, as the API server stamps them)."""
    from standin.harness.support import NS as PROVIDER_NS

    return times_of(c.pods(PROVIDER_NS), job_id)


def times_of(
    pods: list[dict[str, Any]], job_id: int
) -> list[tuple[dt.datetime, dt.datetime | None]]:
    out = []
    for p in pods:
        if (p["metadata"].get("labels") or {}).get("sandman.dev/job") != str(job_id):
            continue
        ready = next(
            (x.get("lastTransitionTime") for x in p["status"].get("conditions", [])
             if x["type"] == "Ready" and x["status"] == "True"), None,
        )  # fmt: skip
        out.append((_parse(p["metadata"]["creationTimestamp"]), _parse(ready) if ready else None))
    return out


def sent_times(job_id: int) -> list[dt.datetime]:
    """When each create of the job was answered by the API (``api_created_at``: the
    controller's clock right after the create call returned, microseconds)."""
    from sandboxes.models import Sandbox

    return list(
        Sandbox.objects.filter(job_id=job_id, api_created_at__isnull=False).values_list(
            "api_created_at", flat=True
        )
    )


def send_times(job_id: int) -> list[dt.datetime]:
    """When each create of the job left its pacer and was sent (the ``create_sent`` event:
    the controller's clock after the job and cluster buckets and a creating slot)."""
    from sandboxes import events
    from sandboxes.models import SandboxEvent

    return list(
        SandboxEvent.objects.filter(sandbox__job_id=job_id, kind=events.CREATE_SENT).values_list(
            "at", flat=True
        )
    )


def slope_rate(times: list[dt.datetime], skip: int = 0) -> float | None:
    """Creates per second as the least-squares slope of create index over time (after the
    first ``skip``, a bucket's burst): robust to a few late or early stamps at the ends."""
    ts = sorted(times)[skip:]
    if len(ts) < 3:
        return None
    xs = [(t - ts[0]).total_seconds() for t in ts]
    mean_x, mean_y = sum(xs) / len(xs), (len(xs) - 1) / 2
    var = sum((x - mean_x) ** 2 for x in xs)
    cov = sum((x - mean_x) * (i - mean_y) for i, x in enumerate(xs))
    return round(cov / var, 3) if var > 0 else None


def rate_of(created: list[dt.datetime], skip: int = 0) -> float | None:
    times = sorted(created)[skip:]
    if len(times) < 2:
        return None
    span = (times[-1] - times[0]).total_seconds()
    return round((len(times) - 1) / span, 3) if span > 0 else None


def min_free(c: Any) -> int:
    return min(s["AvailableIpAddressCount"] for s in c.subnets()["Subnets"])


class ThreadStandin:
    """The stand-in in this process (its own thread and loop, ``virtual`` time: a pod is
    Ready as soon as the server loop is free): it shares this process's GIL with the
    controller, which a real API server never does."""

    def __init__(self, nodes: int, seed: int) -> None:
        self.cluster = cluster(nodes, seed=seed)

    def controller(self, **kw: Any) -> Any:
        return controller_for(self.cluster, **kw)

    def pods(self) -> list[dict[str, Any]]:
        from standin.harness.support import NS as PROVIDER_NS

        return list(self.cluster.pods(PROVIDER_NS))

    def address_failures(self) -> int:
        return int(self.cluster.address_failures()["total"])

    def cpu_seconds(self) -> float | None:
        return None  # inside this process's figure

    def stop(self) -> None:
        self.cluster.stop()


class ProcessStandin:
    """The stand-in as its own process (``manage.py standin_cluster``, ``realtime`` at
    speed 1: pods start in their modelled seconds, as on a cluster), reached over HTTP
    like an API server on another host; its CPU is measured apart."""

    def __init__(self, nodes: int, seed: int, tmp: Path) -> None:
        extra = ["--warm-ip-target", "2"]
        extra += [f"--subnet={s.id}={s.cidr}@{s.zone}" for s in subnets()]
        self.proc = StandinProcess(tmp, nodes=nodes, speed=1.0, seed=seed, extra=extra)

    def controller(self, **kw: Any) -> Any:
        from sandboxes.controller import Controller
        from sandboxes.providers.kubernetes import KubernetesProvider

        # As ``controller_for`` configures the in-process one.
        config = self.proc.provider_config(max_workers=16, destroy_attempts=3)
        ctl = Controller(provider=KubernetesProvider(config), sweep_interval_s=0, **kw)
        ctl.start()
        return ctl

    def pods(self) -> list[dict[str, Any]]:
        return [p for p in self.proc.get("pods") if p["metadata"].get("namespace") == NAMESPACE]

    def address_failures(self) -> int:
        return int(self.proc.get("address-failures")["total"])

    def cpu_seconds(self) -> float | None:
        return self.proc.cpu_seconds()

    def stop(self) -> None:
        self.proc.stop()


# --- 1. rate sweep -------------------------------------------------------------------------


def rate_sweep(args: argparse.Namespace, where: str, tmp: Path) -> list[dict[str, Any]]:
    """The sweep against a stand-in in a thread of this process or in its own process."""
    out = []
    for rate in args.rates:
        c = (
            ThreadStandin(args.nodes, args.seed)
            if where == "thread"
            else ProcessStandin(args.nodes, args.seed, tmp)
        )
        ctl = None
        try:
            ctl = c.controller(cluster_rate=2.0 * rate, cluster_burst=1)
            job = make_job(f"rate-{rate}-{where}", rate_per_s=float(rate), burst=1, max_live=99,
                           max_creating=99)  # fmt: skip
            fail0 = c.address_failures()
            load0 = os.getloadavg()
            cpu0, wall0, standin0 = time.process_time(), time.monotonic(), c.cpu_seconds()
            (results,) = fire(ctl, [(job.pk, 99)], timeout_s=600.0)
            wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
            standin1 = c.cpu_seconds()
            ok = [r for r in results if not isinstance(r, BaseException)]
            times = times_of(c.pods(), job.pk)
            achieved = slope_rate(send_times(job.pk))
            row = {
                "target_creates_per_s": rate,
                "standin": where,
                "ready": len(ok),
                "failures": sorted(
                    {f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)}
                )[:3],  # fmt: skip
                "achieved_creates_per_s": achieved,
                "rate_error": None if achieved is None else round(achieved / rate - 1.0, 4),
                "answered_creates_per_s": rate_of(sent_times(job.pk)),
                "create_to_ready_s": quantiles(
                    [(r - t).total_seconds() for t, r in times if r is not None]
                ),
                "acquire_wait_ms_with_queue": quantiles([r.wait_ms for r in ok]),
                "address_failures": c.address_failures() - fail0,
                "burst_wall_s": round(wall, 2),
                "cpu_ms_per_create_process": round(1000 * cpu / max(1, len(ok)), 2),
                "loadavg_at_start": [round(x, 2) for x in load0],
            }
            # CPU-seconds per wall second of this process (the controller, plus the
            # stand-in when it runs in a thread here): near 1 while the rate falls short,
            # the process is the limit (one interpreter lock).
            row["process_cpu_cores"] = round(cpu / wall, 3) if wall else None
            if standin0 is not None and standin1 is not None and wall:
                row["standin_cpu_cores"] = round((standin1 - standin0) / wall, 3)
            drain(ctl, [job.pk])
        finally:
            if ctl is not None:
                ctl.stop()
            c.stop()
        print(json.dumps(row), flush=True)
        out.append(row)
    return out


# --- 2. placement contrast (simulated time) -----------------------------------------------


def placement_batch(args: argparse.Namespace, *, spread: bool) -> dict[str, Any]:
    from kubernetes import client

    from sandboxes.providers.base import SandboxSpec
    from sandboxes.providers.kubernetes.config import KubernetesConfig
    from sandboxes.providers.kubernetes.manifest import build_pod_manifest

    config = KubernetesConfig(namespace=NS, topology_spread=spread)
    c = cluster(args.nodes, mode="manual", seed=args.seed)
    configuration = client.Configuration()
    configuration.host = c.url
    api = client.ApiClient(configuration)
    core = client.CoreV1Api(api)
    try:
        free0 = min_free(c)
        lowest = free0
        step = 1.0 / args.placement_rate
        for i in range(args.placement_pods):
            spec = SandboxSpec(
                name=f"sm-1-{i:05d}", nonce=f"n{i}", token="t", job_id=1, role="rollout",
                image=IMAGE, base_commit=None, cpu_millis=SPEC["cpu_millis"],
                memory_bytes=SPEC["memory_bytes"], workspace_bytes=None, egress="deny",
                key_hash="k",
            )  # fmt: skip
            core.create_namespaced_pod(NS, api.sanitize_for_serialization(
                build_pod_manifest(spec, config)))  # fmt: skip
            c.advance(step)  # 10 creates per simulated second
            if i % 100 == 99:
                lowest = min(lowest, min_free(c))
        c.advance(600.0)  # every address retry settles (simulated)
        lowest = min(lowest, min_free(c))
        pods = c.pods(NS)
        per_node = Counter(p["spec"].get("nodeName") for p in pods)
        failures = c.address_failures()
        c2r = []
        for p in pods:
            ready = next((x.get("lastTransitionTime") for x in p["status"].get("conditions", [])
                          if x["type"] == "Ready" and x["status"] == "True"), None)  # fmt: skip
            if ready:
                made = _parse(p["metadata"]["creationTimestamp"])
                c2r.append((_parse(ready) - made).total_seconds())
        return {
            "spread": spread,
            "pods": len(pods),
            "ready": len(c2r),
            "address_failures": failures["total"],
            "pods_with_address_failures": sum(1 for v in failures["by_pod"].values() if v),
            "nodes_used": len(per_node),
            "max_pods_per_node": max(per_node.values()) if per_node else 0,
            "create_to_ready_sim_s": quantiles(c2r),
            "subnet_free_addresses_before": free0,
            "subnet_free_addresses_lowest": lowest,
        }
    finally:
        api.close()
        c.stop()


# --- 3. two jobs at once against the cluster bucket ----------------------------------------


def max_overlap(intervals: list[tuple[dt.datetime, dt.datetime]]) -> int:
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals])
    best = cur = 0
    for _, d in edges:
        cur += d
        best = max(best, cur)
    return best


def two_jobs(args: argparse.Namespace) -> dict[str, Any]:
    from sandboxes.models import Sandbox

    cluster_rate, cluster_burst = 20.0, 20
    c = cluster(args.nodes)
    ctl = controller_for(c, cluster_rate=cluster_rate, cluster_burst=cluster_burst)
    try:
        a = make_job("burst-a", rate_per_s=15.0, burst=15, max_live=250, max_creating=120)
        b = make_job("burst-b", rate_per_s=15.0, burst=15, max_live=300, max_creating=24)
        load0 = os.getloadavg()
        wall0 = time.monotonic()
        res_a, res_b = fire(ctl, [(a.pk, 300), (b.pk, 300)], timeout_s=900.0)
        wall = time.monotonic() - wall0
        times_b = pod_times(c, b.pk)
        sent = send_times(a.pk) + send_times(b.pk)
        # The first ``cluster_burst`` creates go at once (the bucket's burst); the rate is
        # measured over the rest, when each left the pacer.
        achieved = slope_rate(sent, skip=cluster_burst)
        answered = rate_of(sent_times(a.pk) + sent_times(b.pk), skip=cluster_burst)
        live_a = Sandbox.objects.filter(job=a).count()
        refused_a = [r for r in res_a if isinstance(r, BaseException)]
        b_intervals = [(t, r) for t, r in times_b if r is not None]
        result = {
            "cluster_bucket": {"rate_per_s": cluster_rate, "burst": cluster_burst},
            "job_buckets": {"a": 15.0, "b": 15.0, "sum": 30.0},
            "acquires": {"a": 300, "b": 300},
            "ready": {"a": sum(1 for r in res_a if not isinstance(r, BaseException)),
                      "b": sum(1 for r in res_b if not isinstance(r, BaseException))},
            "achieved_cluster_creates_per_s": achieved,
            "cluster_rate_error": None if achieved is None
            else round(abs(achieved / cluster_rate - 1.0), 4),
            "answered_cluster_creates_per_s": answered,
            "rate_measure": "least-squares slope of create_sent times after the burst; "
            "answered_*: (n-1)/span of the API answers (api_created_at), which a backlog "
            "of slow first answers biases upward",
            "target_error_max": 0.05,
            "job_a": {
                "max_live": 250,
                "sandbox_rows": live_a,
                "refused": len(refused_a),
                "refusal_codes": sorted({getattr(r, "code", type(r).__name__)
                                         for r in refused_a}),
            },
            "job_b": {
                "max_creating": 24,
                "max_concurrent_creates_stored_to_ready": max_overlap(b_intervals),
                "creates_per_s": slope_rate(send_times(b.pk)),
            },
            "burst_wall_s": round(wall, 2),
            "loadavg_at_start": [round(x, 2) for x in load0],
        }  # fmt: skip
        drain(ctl, [a.pk, b.pk])
        return result
    finally:
        ctl.stop()
        c.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="rate_sweep,placement,two_jobs")
    parser.add_argument("--rates", default=",".join(str(r) for r in RATES))
    parser.add_argument("--nodes", type=int, default=30)
    parser.add_argument("--placement-pods", type=int, default=1000)
    parser.add_argument("--placement-rate", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--standin",
        default="process,thread",
        help="where the rate sweep's stand-in runs: process (its own, as an API server on "
        "another host), thread (in this process), or both (one sweep after the other)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.rates = [int(r) for r in args.rates.split(",") if r]
    parts = [p for p in args.parts.split(",") if p]
    with tempfile.TemporaryDirectory(prefix="sandman-bench-place-") as name:
        vendor = setup_django(Path(name))
        load_before = os.getloadavg()
        result: dict[str, Any] = {
            "benchmark": "placement_rates",
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "server": (
                "none (controller in process, no HTTP front); the rate sweep's stand-in as"
                " --standin says (rate_sweep: its own process; rate_sweep_thread: a thread of"
                " this process), the placement and two-job parts' in process"
            ),
            "settings": {
                "DJANGO_SETTINGS_MODULE": os.environ["DJANGO_SETTINGS_MODULE"],
                "verify_health": False,
            },  # fmt: skip
            "machine": {
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "database": vendor,
                "loadavg_before": [round(x, 2) for x in load_before],
            },  # fmt: skip
            "options": {**vars(args), "out": str(args.out), "spec": SPEC},
        }
        if "rate_sweep" in parts:
            for where in [w for w in args.standin.split(",") if w]:
                if where not in ("process", "thread"):
                    parser.error(f"--standin: {where!r} is neither process nor thread")
                key = "rate_sweep" if where == "process" else "rate_sweep_thread"
                result[key] = rate_sweep(args, where, Path(name))
        if "placement" in parts:
            result["placement"] = {
                "what": "two 1,000-pod batches at 10/s in simulated time (Figure 3b)",
                "spread": placement_batch(args, spread=True),
                "default": placement_batch(args, spread=False),
            }
            print(json.dumps(result["placement"]), flush=True)
        if "two_jobs" in parts:
            result["two_jobs"] = two_jobs(args)
            print(json.dumps(result["two_jobs"]), flush=True)
        result["machine"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
