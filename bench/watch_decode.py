#!/usr/bin/env python3
"""Benchmark: CPU to decode one pod watch event, the standard library's ``json`` (the
baseline, same run) beside ``orjson`` when importable (``sandboxes/providers/kubernetes/
fastjson.py``'s fast path; the optional ``fast`` extra).

The event is a synthetic Ready pod of the shape the stand-in serves (metadata with
labels and annotations, one container with env and limits, four conditions), one JSON line
as a watch stream sends it. ``time.process_time()`` over ``--n`` decodes each, alternating
``--rounds`` times. Results: ``bench/results/watch_decode.json``.
Usage: ``python bench/watch_decode.py [--n 20000] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def pod_event() -> str:
    labels = {f"sandman.dev/l{i}": "v" * 20 for i in range(8)}
    annotations = {f"sandman.dev/a{i}": "w" * 40 for i in range(6)}
    conditions = [
        {"type": t, "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        for t in ("Ready", "Initialized", "PodScheduled", "ContainersReady")
    ]
    env = [{"name": f"E{i}", "value": "x" * 30} for i in range(12)]
    pod: dict[str, Any] = {
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {"name": "sm-1-0123456789ab", "namespace": "sandman", "uid": "u" * 36,
                     "resourceVersion": "12345", "labels": labels, "annotations": annotations},
        "spec": {"containers": [{"name": "execd", "image": "img", "env": env,
                                 "resources": {"limits": {"cpu": "500m", "memory": "256Mi"}}}]},
        "status": {"phase": "Running", "conditions": conditions, "podIP": "10.0.0.1"},
    }  # fmt: skip
    return json.dumps({"type": "MODIFIED", "object": pod})


def per_decode_us(loads: Any, line: str, n: int) -> float:
    t0 = time.process_time()
    for _ in range(n):
        loads(line)
    return round((time.process_time() - t0) / n * 1e6, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    line = pod_event()
    decoders: dict[str, Any] = {"json": json.loads}
    version = None  # orjson's version, None when it is not installed
    try:
        import orjson

        decoders["orjson"], version = orjson.loads, orjson.__version__
    except ImportError:
        pass
    load0 = os.getloadavg()
    runs: dict[str, list[float]] = {name: [] for name in decoders}
    for _ in range(args.rounds):
        for name, loads in decoders.items():
            runs[name].append(per_decode_us(loads, line, args.n))
    result = {
        "benchmark": "watch_decode",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": f"CPU per decode of one {len(line)}-byte pod watch event, {args.n} decodes "
        f"a round, {args.rounds} rounds alternating; json is the same-run baseline",
        "server": "none (in process)",
        "settings": {"orjson": version},
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in load0],
            "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        },  # fmt: skip
        "median_us_per_decode": {name: statistics.median(v) for name, v in runs.items()},
        "runs_us_per_decode": runs,
    }
    out = ROOT / "bench" / "results" / "watch_decode.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["median_us_per_decode"]))


if __name__ == "__main__":
    main()
