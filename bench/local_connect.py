#!/usr/bin/env python3
"""Benchmark: a new connection to a local isolated sandbox's execd, this tree beside a
baseline commit, alternating.

A web worker's claim health-checks each warm pod once, on a new connection
(``ExecdHealth(keep_connections=False)``), and an agent's client may open new
connections too. An isolated local sandbox lives in a network namespace of its own; the
provider binds its port in the host's. Before 6308a5d the sandbox's first process
(``sandbox_init``) accepted there and relayed each connection to execd through two more
threads and hops; since, execd accepts on that socket itself (``execd --listen-fd``).

Each run (one process per tree: ``--one``, with the tree first on ``PYTHONPATH``; this
tree's measuring code either way) starts ONE isolated, egress-denied sandbox of the local
provider and measures, client side, after 50 warm-up calls each:

* ``health_new``: ``GET /health`` on a new connection each time (what a claim does),
* ``health_kept``: the same over one kept-alive connection (what the controller does),
* ``exec_new``: ``POST /exec {"command": "echo hi"}`` on a new connection (urllib).

Results: ``bench/results/local_connect.json`` (``--out``).
Usage: ``python bench/local_connect.py [--baseline REV] [--rounds 3] [--calls 400]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import baseline_tree  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
WARM_UP = 50


def _summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {
        "n": len(ms),
        "p50": round(statistics.median(ms), 3),
        "p90": round(ordered[int(len(ms) * 0.9)], 3),
        "mean": round(statistics.fmean(ms), 3),
    }


async def _measure(calls: int) -> dict[str, Any]:
    """One sandbox of the tree on ``sys.path``; its figures."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "sandman_site.settings.test")
    from sandboxes.providers.local import LocalProvider
    from sandboxes.providers.local.health import ExecdHealth
    from sandboxes.tests.providers.local_support import make_spec, run_in

    root = Path(tempfile.mkdtemp(prefix="sandman-connect-", dir="/tmp"))
    root.chmod(0o711)  # the sandbox user must reach its directory
    images = Path(tempfile.mkdtemp(prefix="sandman-connect-images-"))
    provider = LocalProvider(root=root, images_dir=images, isolation_mode="auto")
    out: dict[str, Any] = {}
    try:
        runtime = await provider.runtime()
        if not runtime.isolated:
            raise SystemExit(f"no isolated local sandboxes on this host: {runtime.reason}")
        spec = make_spec("sb-connect", egress="deny")
        handle = await provider.create(spec)
        info = await provider.wait_ready(handle, 60)
        for name, keep in (("health_new", False), ("health_kept", True)):
            health = ExecdHealth(5.0, keep_connections=keep)
            ms = []
            for i in range(WARM_UP + calls):
                t = time.perf_counter()
                assert await health.check(spec.name, info.address, spec.token)
                if i >= WARM_UP:
                    ms.append((time.perf_counter() - t) * 1000)
            await health.close()
            out[name] = _summary(ms)
        ms = []
        for i in range(WARM_UP + calls // 2):
            t = time.perf_counter()
            answer = await run_in(info.address, spec.token, "echo hi")
            assert answer.get("exit_code") == 0, answer
            if i >= WARM_UP:
                ms.append((time.perf_counter() - t) * 1000)
        out["exec_new"] = _summary(ms)
        await provider.destroy(handle)
    finally:
        await provider.close()
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(images, ignore_errors=True)
    return out


def run_once(tree: Path, tag: str, calls: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    load = os.getloadavg()
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--one", "--calls", str(calls)],
        cwd=tree, env=env, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the {tag} run failed:\n{done.stderr[-3000:]}")
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    return {"tree": tag, "loadavg_at_start": [round(x, 2) for x in load], **figures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", default="10b2fef")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--out", type=Path, default=RESULTS / "local_connect.json")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:  # a child: measure the tree on PYTHONPATH, print one JSON line
        print(json.dumps(asyncio.run(_measure(args.calls))))
        return
    runs = []
    with tempfile.TemporaryDirectory(prefix="sandman-connect-baseline-") as tmp:
        base = baseline_tree.extract(args.baseline, Path(tmp))
        for _ in range(args.rounds):
            runs.append(run_once(base, "baseline", args.calls))
            runs.append(run_once(ROOT, "this", args.calls))
    summary = {
        tag: {
            kind: [r[kind]["p50"] for r in runs if r["tree"] == tag]
            for kind in ("health_new", "health_kept", "exec_new")
        }
        for tag in ("baseline", "this")
    }
    result = {
        "benchmark": "local_connect",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": "client-side ms of calls to one isolated, egress-denied local sandbox's "
        f"execd, baseline {args.baseline} and this tree alternating, {args.rounds} rounds, "
        f"{args.calls} health checks of each kind and {args.calls // 2} execs per run",
        "server": "execd in a local isolated sandbox (bubblewrap), loopback",
        "settings": {"isolation": "auto (isolated)", "egress": "deny"},
        "machine": baseline_tree.machine(),
        "summary_p50_ms_per_run": summary,
        "runs": runs,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
