#!/usr/bin/env python3
"""Benchmark: local provider create-to-healthy for ``sandman/empty``, isolation on and off.

For each mode it runs ``--creates`` sandboxes one after another. Each sample is the time
from calling ``create`` to ``wait_ready`` returning (execd printed ``listening on`` and
answered ``/health`` with ok at the address handed out). ``create`` alone and ``destroy``
are recorded too. Sandboxes are destroyed between samples, so every sample is a cold
create (no warm pool). As a baseline, execd alone is started directly (no provider, no
sandbox) with each interpreter until it prints ``listening on``: the difference is what
the provider (workspace, cgroup, bubblewrap, the sandbox's init) adds. Isolated mode uses
``SANDMAN_LOCAL_ISOLATION=require`` with an egress-denied spec (the slower path: a network
namespace and the in-sandbox relay) and with an allowed one.

A burst of 16 creates started together (quarter-core spec, isolated, egress denied)
measures create-to-healthy under contention, as replacements after a burst of warm
hand-outs see it. Target (the brief's): p50 <= 150 ms for ``sandman/empty``. The JSON
records what was measured with the target beside it. Results: ``bench/results/local_create.json``.

Usage: ``python bench/local_create.py [--creates 30]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandboxes.providers.base import SandboxSpec  # noqa: E402
from sandboxes.providers.local import LocalProvider  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "local_create.json"
TARGET_P50_MS = 150.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50_ms": round(pct(values, 0.5), 2),
        "p90_ms": round(pct(values, 0.9), 2),
        "max_ms": round(max(values), 2),
        "min_ms": round(min(values), 2),
    }


def bare_execd_start(python: str, creates: int, scratch: Path) -> dict[str, float]:
    """Baseline: execd started directly (no provider, no sandbox) until ``listening on``."""
    token = scratch / "token"
    token.write_text("bench-token")
    samples = []
    for i in range(creates + 1):
        t0 = time.perf_counter()
        child = subprocess.Popen(
            [
                python,
                "-m",
                "execd",
                "--port",
                "0",
                "--token-file",
                str(token),
                "--workspace",
                str(scratch),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert child.stdout is not None
        line = child.stdout.readline()
        t1 = time.perf_counter()
        child.terminate()
        child.wait()
        assert line.startswith(b"listening on"), line
        if i:
            samples.append((t1 - t0) * 1000)
    return summary(samples)


def _spec(name: str, egress: str, cpu_millis: int) -> SandboxSpec:
    return SandboxSpec(
        name=name,
        nonce=f"n-{name}",
        token=f"t-{name}",
        job_id=1,
        role="rollout",
        image="sandman/empty",
        base_commit=None,
        cpu_millis=cpu_millis,
        memory_bytes=512 * 2**20,
        workspace_bytes=None,
        egress=egress,
        key_hash="k",
    )


async def run_burst(
    mode: str, egress: str, size: int, cpu_millis: int, root: Path, images: Path
) -> dict:
    """``size`` creates started at once (a burst of replacements): each one's
    create-to-healthy while the others start on the same two cores."""
    provider = LocalProvider(root=root, images_dir=images, isolation_mode=mode)
    await provider.runtime()

    async def one(i: int) -> tuple[float, object]:
        t0 = time.perf_counter()
        handle = await provider.create(_spec(f"burst-{cpu_millis}-{i}", egress, cpu_millis))
        await provider.wait_ready(handle, 60.0)
        return (time.perf_counter() - t0) * 1000, handle

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(size)))
    wall = (time.perf_counter() - t0) * 1000
    for _, handle in results:
        await provider.destroy(handle)
    await provider.close()
    return {
        "isolation_setting": mode,
        "egress": egress,
        "cpu_millis": cpu_millis,
        "burst_size": size,
        "create_to_healthy": summary([ms for ms, _ in results]),
        "all_healthy_after_ms": round(wall, 2),
    }


async def run_mode(
    mode: str, egress: str, creates: int, root: Path, images: Path, cpu_millis: int = 1000
) -> dict:
    provider = LocalProvider(root=root, images_dir=images, isolation_mode=mode)
    runtime = await provider.runtime()
    to_healthy, create_only, destroy = [], [], []
    guards: dict[str, object] = {}
    for i in range(creates + 1):  # the first is a warm-up (page cache, probe), not counted
        spec = _spec(f"bench-{mode}-{egress}-{cpu_millis}-{i}", egress, cpu_millis)
        t0 = time.perf_counter()
        handle = await provider.create(spec)
        t1 = time.perf_counter()
        info = await provider.wait_ready(handle, 30.0)
        t2 = time.perf_counter()
        await provider.destroy(handle)
        t3 = time.perf_counter()
        if i:
            create_only.append((t1 - t0) * 1000)
            to_healthy.append((t2 - t0) * 1000)
            destroy.append((t3 - t2) * 1000)
        guards = info.guards
    await provider.close()
    return {
        "isolation_setting": mode,
        "isolated": runtime.isolated,
        "python": runtime.python.path,
        "egress": egress,
        "cpu_millis": cpu_millis,
        "create_to_healthy": summary(to_healthy),
        "create_call": summary(create_only),
        "destroy": summary(destroy),
        "guards_of_last": guards,
        "target_p50_ms": TARGET_P50_MS,
        "meets_target_p50": pct(to_healthy, 0.5) <= TARGET_P50_MS,
    }


async def main(creates: int) -> dict:
    load_at_start = os.getloadavg()
    root = Path(tempfile.mkdtemp(prefix="sandman-bench-", dir="/tmp"))
    os.chmod(root, 0o711)
    images = root / ".images"
    images.mkdir()
    try:
        runs = [
            await run_mode("off", "allow", creates, root, images),
            await run_mode("require", "allow", creates, root, images),
            await run_mode("require", "deny", creates, root, images),
            # The acquire benchmark's spec: a quarter core (the CPU limit is written at
            # Ready, so start-up is not throttled by it).
            await run_mode("require", "deny", creates, root, images, cpu_millis=250),
        ]
        bursts = [await run_burst("require", "deny", 16, 250, root, images)]
        baselines = {
            run["python"]: bare_execd_start(run["python"], creates, images) for run in runs
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "benchmark": "local provider create-to-healthy, sandman/empty, sequential",
        "host": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "load_average_at_start": load_at_start,
        "load_average_at_end": os.getloadavg(),
        "note": "the host's other work shares its 2 cores; compare runs only at similar load",
        "runs": runs,
        "bursts": bursts,
        "bare_execd_start_to_listening": baselines,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--creates", type=int, default=30)
    args = parser.parse_args()
    result = asyncio.run(main(args.creates))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    for python, baseline in result["bare_execd_start_to_listening"].items():
        print("bare execd", python, json.dumps(baseline))
    for run in result["runs"]:
        print(
            run["isolation_setting"],
            run["egress"],
            "isolated" if run["isolated"] else "plain",
            json.dumps(run["create_to_healthy"]),
        )
    for burst in result["bursts"]:
        print("burst", burst["burst_size"], json.dumps(burst["create_to_healthy"]))
    print(f"wrote {RESULTS}")
