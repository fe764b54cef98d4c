#!/usr/bin/env python3
"""Benchmark: the ramp to 12,000 live sandboxes through one controller (issue 13, item 1;
paper §5.2, Tables A11-A13).

The stand-in cluster runs OUT of process (``manage.py standin_cluster``, real time, no
execd behind the pods, ``SANDMAN_K8S_VERIFY_HEALTH=false``); the real controller, pool and
Kubernetes provider run in this process over a fresh database (a temp SQLite file, or
``DATABASE_URL`` under ``scripts/with_postgres.py``). ONE controller, one provider (so one
pod watch and one Events watch) serve every step.

Per step N (default 99, 250, 500, 1,000, 2,000, 4,000, 8,000, 12,000): a fresh job whose
bucket paces creates at ``--rate`` (default 20/s; ``max_live`` = ``max_creating`` = N, so
only the buckets pace), N tiny acquires fired at once by a driver loop, then:
* Ready count, not Ready within the readiness budget / other failures, address failures
  (the stand-in's count for this step);
* create-to-Ready p50/p90/p99 (the stand-in's stamps: API stored -> Ready), acquire wait
  with the pacer queue (``wait_ms``) p50/p90/p99;
* Kubernetes API call p99 (the provider's executor: every create of the step);
* controller RSS (VmRSS at the step's peak, all N live) and CPU-seconds per create
  (``time.process_time()`` of this process over the burst / creates), by thread role, and
  the cyclic collector's pauses inside the burst by generation (``gc_pauses_in_burst``);
* the watches: pod and Events informer lists and watches (one reconnect per expiry);
* after the job's drain: pods left in the stand-in (must be 0).
The last step is held live for ``--hold-s`` (default 300) before its drain, sampling RSS
and CPU while the pods sit idle (no per-pod timers: idle CPU should be ~0).

``--write-batch-max 1`` runs the controller writing one row per transaction (the same-run
baseline of the batching, ``sandboxes/controller/batcher.py``).

Results: ``bench/results/scale_ramp.json`` and the self-contained report
``bench/results/scale_ramp.html`` (Plotly JS inlined, no CDN).
Usage: ``python bench/scale_ramp.py [--steps 99,250,...] [--rate 20] [--nodes 150]``
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import gc
import json
import os
import platform
import resource
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from k8s_burst import StandinProcess, pct, setup_django  # noqa: E402

RESULTS = ROOT / "bench" / "results"
IMAGE = "registry.example/task/swe-task:1"
SPEC = {"cpu_millis": 100, "memory_bytes": 128 * 2**20, "workspace_bytes": None}
STEPS = (99, 250, 500, 1000, 2000, 4000, 8000, 12000)


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024.0, 1)
    return 0.0


def thread_cpu_s() -> dict[str, float]:
    """CPU-seconds (user + system) of this process's threads, summed by role (the thread's
    name without its number: ``sandman-k8s_3`` -> ``sandman-k8s``), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        name = names.get(int(task.name), "other")
        role = name.rstrip("0123456789").rstrip("_-") or name
        out[role] = out.get(role, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


class GcPauses:
    """The cyclic collector's pauses in this process, by generation (``gc.callbacks``):
    collections and seconds of wall time (a collection holds the interpreter lock, so its
    wall time is CPU of whichever thread triggered it)."""

    def __init__(self) -> None:
        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            gen = info["generation"]
            self.count[gen] += 1
            self.seconds[gen] += time.perf_counter() - self._started

    def snapshot(self) -> tuple[list[int], list[float]]:
        return list(self.count), list(self.seconds)

    @staticmethod
    def delta(
        before: tuple[list[int], list[float]], after: tuple[list[int], list[float]]
    ) -> dict[str, Any]:
        return {
            f"gen{g}": {
                "collections": after[0][g] - before[0][g],
                "s": round(after[1][g] - before[1][g], 3),
            }
            for g in range(3)
        }


GC = GcPauses()


def thread_cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    roles = set(before) | set(after)
    delta = {r: round(after.get(r, 0.0) - before.get(r, 0.0), 2) for r in roles}
    return dict(sorted(((r, d) for r, d in delta.items() if d > 0), key=lambda kv: -kv[1]))


def quantiles(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "p50": pct(values, 0.5),
        "p90": pct(values, 0.9),
        "p99": pct(values, 0.99),
        "max": round(max(values), 2) if values else None,
    }


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Ramp:
    """One controller and provider against one stand-in; one job per step."""

    def __init__(self, tmp: Path, args: argparse.Namespace) -> None:
        from django.contrib.auth import get_user_model

        from sandboxes.controller import Controller
        from sandboxes.providers.kubernetes import KubernetesProvider

        self.args = args
        self.standin = StandinProcess(tmp, nodes=args.nodes, speed=1.0, seed=args.seed)
        self.config = self.standin.provider_config(topology_spread=True)
        self.provider, self.controller = self._controller(KubernetesProvider, Controller)
        self.owner, _ = get_user_model().objects.get_or_create(username="ramp")

    def _controller(self, provider_cls: Any, controller_cls: Any) -> tuple[Any, Any]:
        """A provider and a started controller (its start reconciles with the stand-in)."""
        provider = provider_cls(self.config)
        controller = controller_cls(
            provider=provider,
            sweep_interval_s=0,
            cluster_rate=max(self.args.rate * 2, 50.0),
            cluster_burst=100,
            write_batch_max=self.args.write_batch_max,
        )
        controller.start()
        return provider, controller

    def restart(self, job: Any) -> dict[str, Any]:
        """A new controller takes over the live step (as a new leader does after a
        failover): the old one stops, the new one's ``start()`` lists the pods, reads the
        rows and adopts every live sandbox before it returns. Its wall time and this
        process's CPU over it, and the adoptions recorded."""
        from sandboxes import events
        from sandboxes.controller import Controller
        from sandboxes.models import SandboxEvent
        from sandboxes.providers.kubernetes import KubernetesProvider

        self.controller.stop()
        wall0, cpu0 = time.monotonic(), time.process_time()
        self.provider, self.controller = self._controller(KubernetesProvider, Controller)
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        adopted = SandboxEvent.objects.filter(sandbox__job=job, kind=events.ADOPTED).count()
        return {"reconcile_wall_s": round(wall, 2), "reconcile_cpu_s": round(cpu, 2),
                "adopted": adopted}  # fmt: skip

    def close(self) -> None:
        self.controller.stop()
        self.standin.stop()

    def watches(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, inf in (
            ("pods", self.provider.informer),
            ("events", self.provider.event_informer),
        ):
            if inf is not None:
                out[name] = {
                    "lists": inf.lists,
                    "watches": inf.watches,
                    "relists_after_gone": inf.relists_after_gone,
                }
        return out

    def step(self, n: int, *, hold_s: float = 0.0) -> dict[str, Any]:
        from sandboxes import labels as L
        from sandboxes.models import Job, Sandbox
        from sandboxes.services import job_create

        args = self.args
        job = job_create(
            owner=self.owner, name=f"ramp-{n}", rate_per_s=args.rate, burst=args.burst,
            max_live=n, max_creating=n, readiness_budget_s=args.budget_s, egress="deny",
            now=_now(),
        )  # fmt: skip
        failures0 = self.standin.get("address-failures").get("total", 0)
        calls0 = {op: len(v) for op, v in self.provider.api_call_ms().items()}
        stats0 = self.controller.stats().get("write_batches", {})

        async def burst() -> list[Any]:
            return await asyncio.gather(
                *(
                    self.controller.aacquire(
                        job_id=job.pk,
                        image=IMAGE,
                        base_commit=None,
                        role="rollout",
                        timeout_s=args.budget_s + n / args.rate + 120.0,
                        **SPEC,
                    )  # fmt: skip
                    for _ in range(n)
                ),
                return_exceptions=True,
            )

        load0 = os.getloadavg()
        cpu0, wall0 = time.process_time(), time.monotonic()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        threads0 = thread_cpu_s()
        gc0 = GC.snapshot()
        standin_cpu0 = self.standin.cpu_seconds()
        results = asyncio.run(burst())
        gc_burst = GcPauses.delta(gc0, GC.snapshot())
        wall, cpu = time.monotonic() - wall0, time.process_time() - cpu0
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        threads1 = thread_cpu_s()
        standin_cpu = self.standin.cpu_seconds() - standin_cpu0
        rss_live = rss_mib()
        ok = [r for r in results if not isinstance(r, BaseException)]
        errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
        not_ready = sum(1 for e in errors if "ready" in e.lower() or "budget" in e.lower())
        stats1 = self.controller.stats().get("write_batches", {})
        hold: dict[str, Any] = {}
        if hold_s > 0:
            hold = self._hold(hold_s)
        rows = Sandbox.objects.filter(job=job, ready_at__isnull=False, api_created_at__isnull=False)
        c2r = [(r.ready_at - r.api_created_at).total_seconds() * 1000.0 for r in rows]
        calls = self.provider.api_call_ms()
        create_ms = calls.get("create", [])[calls0.get("create", 0) :]
        all_ms = [x for op, v in calls.items() for x in v[calls0.get(op, 0) :]]
        failures = self.standin.get("address-failures").get("total", 0) - failures0
        watches = self.watches()
        restart = self.restart(job) if args.restart else None  # the new controller drains
        drain0, drain_cpu0, drain_threads0 = time.monotonic(), time.process_time(), thread_cpu_s()
        self.controller.drain(job_id=job.pk)
        deadline = time.monotonic() + 900
        while Job.objects.get(pk=job.pk).state != "drained" and time.monotonic() < deadline:
            time.sleep(0.5)  # waiting for an observable state, not a measurement
        drain_s = time.monotonic() - drain0
        # The drain's CPU (every delete: its write, the DELETE, the confirmation): this
        # process's, over the drain; the MainThread's share is the poll above.
        drain_cpu = time.process_time() - drain_cpu0
        drain_threads = thread_cpu_delta(drain_threads0, thread_cpu_s())
        left = [
            p["metadata"]["name"]
            for p in self.standin.get("pods")
            if (p["metadata"].get("labels") or {}).get(L.MANAGED_BY) == L.VALUE_MANAGED_BY
        ]
        batches = stats1.get("batches", 0) - stats0.get("batches", 0)
        writes = stats1.get("writes", 0) - stats0.get("writes", 0)
        return {
            "requested": n,
            "ready": len(ok),
            "not_ready_within_budget": not_ready,
            "other_failures": len(errors) - not_ready,
            "error_examples": sorted(set(errors))[:3],
            "address_failures": failures,
            "burst_wall_s": round(wall, 2),
            "creates_per_s": round(len(ok) / wall, 2) if wall else None,
            "create_to_ready_ms": quantiles(c2r),
            "acquire_wait_ms_with_queue": quantiles([r.wait_ms for r in ok]),
            "k8s_create_call_ms": quantiles(create_ms),
            "k8s_api_call_p99_ms": pct(all_ms, 0.99),
            "controller_rss_mib_all_live": rss_live,
            "controller_cpu_s": round(cpu, 2),
            "controller_cpu_ms_per_create": round(1000.0 * cpu / max(1, len(ok)), 3),
            "controller_cpu_user_s": round(ru1.ru_utime - ru0.ru_utime, 2),
            "controller_cpu_sys_s": round(ru1.ru_stime - ru0.ru_stime, 2),
            "controller_cpu_s_by_thread": thread_cpu_delta(threads0, threads1),
            "gc_pauses_in_burst": gc_burst,
            "standin_cpu_s": round(standin_cpu, 2),
            "write_batches": {
                "batches": batches,
                "writes": writes,
                "writes_per_batch": round(writes / batches, 2) if batches else None,
            },
            "watches": watches,
            "hold": hold,
            "restart": restart,
            "drain_s": round(drain_s, 2),
            "drain_cpu_s": round(drain_cpu, 3),
            "drain_cpu_ms_per_sandbox": round(drain_cpu / max(1, len(ok)) * 1000.0, 3),
            "drain_cpu_s_by_thread": drain_threads,
            "pods_left_after_drain": len(left),
            "job_state_after_drain": Job.objects.get(pk=job.pk).state,
            "loadavg_at_start": [round(x, 2) for x in load0],
        }

    def _hold(self, hold_s: float) -> dict[str, Any]:
        """Keep every pod live for ``hold_s``; sample RSS, CPU and the watches meanwhile."""
        watches0 = self.watches()
        cpu0, t0 = time.process_time(), time.monotonic()
        samples = []
        while time.monotonic() - t0 < hold_s:
            time.sleep(min(10.0, hold_s))  # a sampling period, not a synchronisation
            samples.append(
                {"t_s": round(time.monotonic() - t0, 1), "rss_mib": rss_mib(),
                 "cpu_s": round(time.process_time() - cpu0, 3)}
            )  # fmt: skip
        held = time.monotonic() - t0
        return {
            "held_s": round(held, 1),
            "idle_cpu_s_per_s": round((time.process_time() - cpu0) / held, 4),
            "rss_mib_max": max(s["rss_mib"] for s in samples),
            "watches_before": watches0,
            "watches_after": self.watches(),
            "samples": samples,
        }


def report_html(result: dict[str, Any], path: Path) -> None:
    """A self-contained Plotly page (the JS inlined: no CDN)."""
    import plotly.graph_objects as go
    import plotly.io as pio
    from plotly.subplots import make_subplots

    steps = result["steps"]
    xs = [s["requested"] for s in steps]
    fig = make_subplots(
        rows=2, cols=2,
        subplot_titles=(
            "create-to-Ready (ms)", "acquire wait with queue (ms)",
            "controller CPU ms per create / RSS MiB", "Ready vs requested",
        ),
    )  # fmt: skip
    for q in ("p50", "p90", "p99"):
        fig.add_trace(go.Scatter(x=xs, y=[s["create_to_ready_ms"][q] for s in steps],
                                 name=f"create-to-Ready {q}"), row=1, col=1)  # fmt: skip
        fig.add_trace(go.Scatter(x=xs, y=[s["acquire_wait_ms_with_queue"][q] for s in steps],
                                 name=f"wait {q}"), row=1, col=2)  # fmt: skip
    fig.add_trace(go.Scatter(x=xs, y=[s["controller_cpu_ms_per_create"] for s in steps],
                             name="CPU ms / create"), row=2, col=1)  # fmt: skip
    fig.add_trace(go.Scatter(x=xs, y=[s["controller_rss_mib_all_live"] for s in steps],
                             name="RSS MiB (all live)"), row=2, col=1)  # fmt: skip
    fig.add_trace(go.Bar(x=xs, y=[s["ready"] for s in steps], name="Ready"), row=2, col=2)
    fig.add_trace(go.Bar(x=xs, y=[s["requested"] - s["ready"] for s in steps],
                         name="not Ready"), row=2, col=2)  # fmt: skip
    for axis in ("xaxis", "xaxis2", "xaxis3", "xaxis4"):
        fig.layout[axis].type = "log"
    fig.update_layout(height=800, title=f"scale ramp ({result['generated_at']})")
    table = "<pre>" + json.dumps(
        {k: v for k, v in result.items() if k != "steps"}, indent=2
    ) + "</pre>"  # fmt: skip
    body = pio.to_html(fig, include_plotlyjs=True, full_html=False)
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'><title>scale ramp"
                    f"</title></head><body>{body}{table}</body></html>\n")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", default=",".join(str(s) for s in STEPS))
    parser.add_argument("--rate", type=float, default=20.0, help="job bucket creates/s")
    parser.add_argument("--burst", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=150)
    parser.add_argument("--budget-s", type=float, default=600.0, help="readiness budget")
    parser.add_argument("--hold-s", type=float, default=300.0, help="hold the last step")
    parser.add_argument("--write-batch-max", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--name", default="scale_ramp")
    parser.add_argument(
        "--restart", action="store_true", help="after each step (and its hold) a new "
        "controller takes the live pods over before the drain: its reconcile's time",
    )  # fmt: skip
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",") if s]
    out_json, out_html = RESULTS / f"{args.name}.json", RESULTS / f"{args.name}.html"
    with tempfile.TemporaryDirectory(prefix="sandman-bench-ramp-") as name:
        vendor = setup_django(Path(name))
        load_before = os.getloadavg()
        ramp = Ramp(Path(name), args)
        done: list[dict[str, Any]] = []
        result: dict[str, Any] = {}
        try:
            for i, n in enumerate(steps):
                hold = args.hold_s if i == len(steps) - 1 else 0.0
                done.append(ramp.step(n, hold_s=hold))
                print(json.dumps(done[-1]), flush=True)
                result = {
                    "benchmark": "scale_ramp",
                    "what": "steps of N acquires fired at once, creates paced by the job's "
                    "bucket; one controller, one pod watch, one Events watch; stand-in "
                    "cluster out of process (real time)",
                    "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                    "server": "none (controller in process, no HTTP front)",
                    "settings": {
                        "DJANGO_SETTINGS_MODULE": os.environ["DJANGO_SETTINGS_MODULE"],
                        "SANDMAN_K8S_VERIFY_HEALTH": "false",
                    },  # fmt: skip
                    "machine": {
                        "python": platform.python_version(),
                        "cpus": os.cpu_count(),
                        "database": vendor,
                        "loadavg_before": [round(x, 2) for x in load_before],
                        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                    },
                    "options": {**vars(args), "spec": SPEC},
                    "targets": {
                        "controller_cpu_ms_per_create": 2.0,
                        "controller_rss_mib_at_12000": 1024,
                        "pods_left_after_drain": 0,
                    },
                    "steps": done,
                }
                RESULTS.mkdir(parents=True, exist_ok=True)
                out_json.write_text(json.dumps(result, indent=2) + "\n")  # every step kept
                report_html(result, out_html)
        finally:
            ramp.close()


if __name__ == "__main__":
    main()
