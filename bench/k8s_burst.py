#!/usr/bin/env python3
"""Benchmark: a burst of 1,000 acquires for one job on the Kubernetes provider.

The stand-in cluster runs OUT of process (``python manage.py standin_cluster``, real
time, ``--speed 1`` by default: one simulated second per wall second; no ``--run-execd``)
and the controller runs in this process with ``SANDMAN_K8S_VERIFY_HEALTH=false`` (no
execd behind the pods), over a fresh database (a temp SQLite file, or ``DATABASE_URL``
under ``scripts/with_postgres.py``).

Two variants in one run, each against a fresh stand-in: the pod manifest WITH the soft
topology spread (maxSkew 2, ScheduleAnyway, the default) and WITHOUT it (Figure 3b's
contrast: the stand-in's scheduler packs a burst onto the most allocated node, and
address assignment fails more the more pods a node got in the last 30 s).

Per variant: N acquires fired at once from a trainer's event loop for one job paced at
25 creates/s (job bucket 25/s, burst 25; cluster bucket 50/s, burst 100; max_live and
max_creating = N, so only the buckets pace the creates), then:
* create-to-Ready: the stand-in's own stamps (API stored -> Ready) from the sandbox rows,
  and the controller's view (create sent -> Ready seen), p50/p99;
* acquisition wait with the pacer queue included (``wait_ms``) and the queue alone, p50/p99;
* address failures (the stand-in's count; per pod and pods with >= 1);
* controller CPU-seconds per create: ``time.process_time()`` of this process (the
  controller's loop, its provider threads and database threads, and the trainer loop,
  which only awaits) over the burst, divided by the creates; ``getrusage`` beside it;
* leaks: Sandman pods left in the stand-in's store after the job's drain (must be 0).

Results: ``bench/results/k8s_burst.json``.
Usage: ``python bench/k8s_burst.py [--acquires 1000] [--nodes 50] [--speed 1]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import types
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "k8s_burst.json"
NAMESPACE = "sandman-burst"
IMAGE = "registry.example/task/swe-task:1"
SPEC = {"cpu_millis": 250, "memory_bytes": 256 * 2**20, "workspace_bytes": None}


def pct(values: list[float], q: float) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return round(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo), 2)


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50": pct(values, 0.5),
        "p99": pct(values, 0.99),
        "max": round(max(values), 2) if values else None,
        "mean": round(statistics.fmean(values), 2) if values else None,
    }


def setup_django(tmp: Path) -> str:
    sys.path.insert(0, str(ROOT))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sandman_site.settings.test")
    os.environ["SANDMAN_K8S_VERIFY_HEALTH"] = "false"
    if not os.environ.get("DATABASE_URL"):
        os.environ["DATABASE_URL"] = f"sqlite:///{tmp / 'bench.sqlite3'}"
    import logging

    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    logging.getLogger("sandboxes").setLevel(logging.ERROR)
    from django.db import connection

    return connection.vendor


PIN_ENV = "SANDMAN_BENCH_PIN"  # "1": a stand-in process and its controller on separate CPUs


def pin_apart(pid: int) -> dict[str, list[int]] | None:
    """The stand-in (process ``pid``, every thread) on the machine's last CPU, and the
    calling thread -- so every thread it starts from now on, the controller's -- on the
    others: an API server on another host, as far as two CPUs allow (the caches and
    PostgreSQL are still shared). None on one CPU."""
    cpus = list(range(os.cpu_count() or 1))
    if len(cpus) < 2:
        return None
    apart, own = {cpus[-1]}, set(cpus[:-1])
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), apart)
    os.sched_setaffinity(0, own)
    return {"standin": sorted(apart), "controller": sorted(own)}


class StandinProcess:
    """``manage.py standin_cluster`` as a direct child; stopped with SIGTERM + wait()."""

    def __init__(
        self, tmp: Path, *, nodes: int, speed: float, seed: int, extra: Sequence[str] = ()
    ) -> None:
        """``extra``: more of the command's options (``--subnet``, ``--warm-ip-target``)."""
        self.kubeconfig = tmp / f"kubeconfig-{time.monotonic_ns()}"
        self.proc = subprocess.Popen(
            [
                sys.executable, "manage.py", "standin_cluster", "--port", "0",
                "--kubeconfig", str(self.kubeconfig), "--namespace", NAMESPACE,
                "--nodes", str(nodes), "--speed", str(speed), "--seed", str(seed), *extra,
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on" not in line:
            self.stop()
            raise RuntimeError(f"stand-in did not start: {line!r}")
        self.url = line.split("listening on ", 1)[1].split(";", 1)[0].strip()
        self.pinned = pin_apart(self.proc.pid) if os.environ.get(PIN_ENV) == "1" else None

    def provider_config(self, *, verify_health: bool = False, **changes: Any) -> Any:
        """The Kubernetes provider's config as ``SANDMAN_KUBECONFIG`` pointing at this
        stand-in gives it (``KubernetesProvider.from_settings``), with ``changes``."""
        import dataclasses

        from sandboxes.providers.kubernetes import KubernetesProvider

        settings = types.SimpleNamespace(
            SANDMAN_NAMESPACE=NAMESPACE,
            SANDMAN_KUBECONFIG=str(self.kubeconfig),
            SANDMAN_K8S_VERIFY_HEALTH=verify_health,
        )
        base = KubernetesProvider.from_settings(settings)
        base.api_client.close()
        return dataclasses.replace(base.config, **changes)

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.url}/_standin/{path}", timeout=60) as response:
            return json.loads(response.read())

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def run_variant(tmp: Path, *, spread: bool, args: argparse.Namespace) -> dict[str, Any]:

    from django.contrib.auth import get_user_model

    from sandboxes import labels as L
    from sandboxes.controller import Controller
    from sandboxes.models import Acquisition, Job, Sandbox
    from sandboxes.providers.kubernetes import KubernetesProvider
    from sandboxes.services import job_create

    standin = StandinProcess(tmp, nodes=args.nodes, speed=args.speed, seed=args.seed)
    controller = None
    try:
        config = standin.provider_config(
            verify_health=os.environ["SANDMAN_K8S_VERIFY_HEALTH"] == "true", topology_spread=spread
        )
        provider = KubernetesProvider(config)
        controller = Controller(
            provider=provider, sweep_interval_s=0, cluster_rate=50.0, cluster_burst=100
        )
        controller.start()
        owner, _ = get_user_model().objects.get_or_create(username="bench")
        job = job_create(
            owner=owner, name=f"burst-{'spread' if spread else 'packed'}",
            rate_per_s=25.0, burst=25, max_live=args.acquires, max_creating=args.acquires,
            readiness_budget_s=600.0, egress="deny", now=_now(),
        )  # fmt: skip

        async def burst() -> list[Any]:
            calls = [
                controller.aacquire(
                    job_id=job.pk,
                    image=IMAGE,
                    base_commit=None,
                    role="rollout",
                    timeout_s=1800.0,
                    **SPEC,
                )  # fmt: skip
                for _ in range(args.acquires)
            ]
            return await asyncio.gather(*calls, return_exceptions=True)

        cpu0, wall0 = time.process_time(), time.monotonic()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        standin_cpu0 = standin.cpu_seconds()
        results = asyncio.run(burst())
        wall = time.monotonic() - wall0
        cpu = time.process_time() - cpu0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        standin_cpu = standin.cpu_seconds() - standin_cpu0
        ok = [r for r in results if not isinstance(r, BaseException)]
        errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]

        rows = list(Sandbox.objects.filter(job=job, ready_at__isnull=False))
        stamped = [
            (r.ready_at - r.api_created_at).total_seconds() * 1000.0
            for r in rows
            if r.api_created_at is not None
        ]
        create_ms = [
            a.create_ms for a in Acquisition.objects.filter(job=job) if a.create_ms is not None
        ]
        failures = standin.get("address-failures")
        pods = standin.get("pods")
        sample = next((p for p in pods if p["metadata"]["name"].startswith("sm-")), None)
        constraints = (sample or {}).get("spec", {}).get("topologySpreadConstraints")

        drain0 = time.monotonic()
        controller.drain(job_id=job.pk)
        deadline = time.monotonic() + 600
        while Job.objects.get(pk=job.pk).state != "drained" and time.monotonic() < deadline:
            time.sleep(0.2)  # waiting for an observable state, not a measurement
        drain_s = time.monotonic() - drain0
        left = [
            p["metadata"]["name"]
            for p in standin.get("pods")
            if (p["metadata"].get("labels") or {}).get(L.MANAGED_BY) == L.VALUE_MANAGED_BY
        ]
        anchors = [c["metadata"]["name"] for c in standin.get("state")["configmaps"]]
        nodes_used = sorted({r.node for r in rows if r.node})
        by_pod = failures.get("by_pod") or {}
        return {
            "topology_spread": spread,
            "spread_constraint_on_pods": constraints is not None,
            "acquires": args.acquires,
            "acquired": len(ok),
            "errors": len(errors),
            "error_examples": sorted(set(errors))[:3],
            "burst_wall_s": round(wall, 2),
            "creates_per_s": round(len(ok) / wall, 2) if wall else None,
            "create_to_ready_ms_standin": summary(stamped),
            "create_to_ready_ms_controller": summary(create_ms),
            "acquire_wait_ms_with_queue": summary([r.wait_ms for r in ok]),
            "acquire_queue_ms": summary([r.queue_ms for r in ok]),
            "address_failures": {
                "total": failures.get("total"),
                "pods_with_failures": sum(1 for v in by_pod.values() if v),
                "per_pod_mean": round(failures.get("total", 0) / max(1, len(rows)), 3),
                "nodes_used": len(nodes_used),
                "max_failures_on_one_node": max((failures.get("by_node") or {0: 0}).values()),
            },
            "controller_cpu_s": round(cpu, 2),
            "controller_cpu_s_per_create": round(cpu / max(1, len(ok)), 5),
            "controller_rusage_s_per_create": round(
                (ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime) / max(1, len(ok)), 5
            ),
            "standin_cpu_s": round(standin_cpu, 2),
            "drain_s": round(drain_s, 2),
            "pods_left_after_drain": len(left),
            "anchors_left_after_drain": len(anchors),
            "job_state_after_drain": Job.objects.get(pk=job.pk).state,
        }
    finally:
        if controller is not None:
            controller.stop()
        standin.stop()


def _now() -> Any:
    import datetime as dt

    return dt.datetime.now(dt.UTC)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--acquires", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--speed", type=float, default=1.0, help="stand-in sim s per wall s")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sandman-bench-burst-") as name:
        tmp = Path(name)
        vendor = setup_django(tmp)
        load_before = os.getloadavg()
        variants = []
        for spread in (True, False):
            variants.append(run_variant(tmp, spread=spread, args=args))
            print(json.dumps(variants[-1], indent=2), flush=True)
    result = {
        "benchmark": "k8s_burst",
        "what": f"{args.acquires} acquires at once for one job paced at 25/s; controller "
        "in process, stand-in cluster out of process (real time)",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "database": vendor,
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },
        "standin": {
            "nodes": args.nodes,
            "speed": args.speed,
            "seed": args.seed,
            "run_execd": False,
            "verify_health": False,
        },  # fmt: skip
        "targets": {"pods_left_after_drain": 0},
        "variants": variants,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
