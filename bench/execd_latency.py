"""execd latency benchmark: ``echo hi`` through execd vs a fresh bash per call.

Runs, in one process and side by side (interleaved blocks, so machine load
hits both alike):
- N ``POST /exec {"command": "echo hi"}`` over ONE keep-alive HTTP connection
  (token check and syntax check included, as in production);
- N ``subprocess.run(["bash", "-c", "echo hi"])``, the fork-per-command baseline.
- N ``echo hi`` with ``isolate: true`` (issue 14), interleaved with the plain calls.
Also reports the RSS of an idle execd and the latency of a 1 MiB answer.

Writes bench/results/execd_latency.json and prints it.
Usage: python bench/execd_latency.py [--calls 1000] [--block 50]
"""

import argparse
import datetime
import http.client
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
OUT = os.path.join(HERE, "results", "execd_latency.json")
ONE_MIB_CMD = "head -c 1048576 /dev/zero | tr '\\0' x"


def summary(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000.0 for s in samples)

    def pct(p: float) -> float:
        return round(ms[min(len(ms) - 1, int(p / 100.0 * len(ms)))], 4)

    return {
        "n": len(ms),
        "p50_ms": pct(50),
        "p90_ms": pct(90),
        "p99_ms": pct(99),
        "mean_ms": round(statistics.fmean(ms), 4),
        "min_ms": round(ms[0], 4),
        "max_ms": round(ms[-1], 4),
    }


def status_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key + "_KiB"] = int(val.split()[0])
    return out


def bare_interpreter_rss() -> int:
    code = "import re; print(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read())[1])"
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout)


class Execd:
    def __init__(self, workdir: str) -> None:
        token_file = os.path.join(workdir, "token")
        with open(token_file, "w") as f:
            f.write("bench-token\n")
        ws = os.path.join(workdir, "ws")
        os.mkdir(ws)
        env = dict(os.environ, PYTHONPATH=REPO)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "execd",
                "--port",
                "0",
                "--token-file",
                token_file,
                "--workspace",
                ws,
            ],
            stdout=subprocess.PIPE,
            env=env,
        )
        line = self.proc.stdout.readline().decode()  # type: ignore[union-attr]
        assert line.startswith("listening on "), line
        self.port = int(line.rsplit(":", 1)[1])
        self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        self.headers = {"Authorization": "Bearer bench-token", "Content-Type": "application/json"}

    def exec(self, command: str, **extra: Any) -> dict[str, Any]:
        body = json.dumps({"command": command, **extra})
        self.conn.request("POST", "/exec", body, self.headers)
        resp = self.conn.getresponse()
        body = json.loads(resp.read())
        assert resp.status == 200 and body["exit_code"] == 0, body
        return body

    def stop(self) -> None:
        self.conn.close()
        self.proc.terminate()
        self.proc.wait(30)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def machine() -> dict[str, Any]:
    bash = subprocess.run(["bash", "--version"], capture_output=True, text=True).stdout
    return {
        "nproc": os.cpu_count(),
        "visible_cpus": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "bash": bash.splitlines()[0] if bash else None,
        "loadavg_at_start": list(os.getloadavg()),
    }


def main() -> dict[str, Any]:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--block", type=int, default=50)
    ap.add_argument("--mib-calls", type=int, default=50)
    ap.add_argument("--out", default=OUT, help="where the JSON goes")
    args = ap.parse_args()
    info = machine()
    with tempfile.TemporaryDirectory(prefix="execd-bench-") as tmp:
        d = Execd(tmp)
        try:
            for _ in range(100):  # warm-up: code paths, page cache, the shell
                d.exec("echo hi")
                subprocess.run(["bash", "-c", "echo hi"], capture_output=True, check=True)
            idle = status_kib(d.proc.pid)
            execd_t, base_t, iso_t = [], [], []  # type: List[float], List[float], List[float]
            while len(execd_t) < args.calls:
                for _ in range(min(args.block, args.calls - len(execd_t))):
                    execd_t.append(timed(lambda: d.exec("echo hi")))
                for _ in range(min(args.block, args.calls - len(iso_t))):
                    iso_t.append(timed(lambda: d.exec("echo hi", isolate=True)))
                for _ in range(min(args.block, args.calls - len(base_t))):
                    base_t.append(
                        timed(
                            lambda: subprocess.run(
                                ["bash", "-c", "echo hi"], capture_output=True, check=True
                            )
                        )
                    )
            mib_t, mib_base_t = [], []  # type: List[float], List[float]
            answer = d.exec(ONE_MIB_CMD)
            for _ in range(args.mib_calls):
                mib_t.append(timed(lambda: d.exec(ONE_MIB_CMD)))
                mib_base_t.append(
                    timed(
                        lambda: subprocess.run(
                            ["bash", "-c", ONE_MIB_CMD], capture_output=True, check=True
                        )
                    )
                )
            after = status_kib(d.proc.pid)
        finally:
            d.stop()
    ex, base, iso = summary(execd_t), summary(base_t), summary(iso_t)
    result = {
        "benchmark": "execd_latency",
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": dict(info, loadavg_at_end=list(os.getloadavg())),
        "method": (
            f"{args.calls} calls each, interleaved in blocks of {args.block} after 100 warm-up "
            'calls; execd: POST /exec {"command": "echo hi"} over one keep-alive '
            "http.client connection, token and syntax check included, client-side "
            'wall time; baseline: subprocess.run(["bash", "-c", "echo hi"], '
            "capture_output=True)"
        ),
        "echo_hi": {
            "execd": ex,
            "baseline_bash_c": base,
            "speedup_p50": round(base["p50_ms"] / ex["p50_ms"], 2),
            "speedup_mean": round(base["mean_ms"] / ex["mean_ms"], 2),
        },
        "echo_hi_isolated": {
            "note": 'POST /exec {"command": "echo hi", "isolate": true} (a subshell per '
            "call: one fork of the persistent bash), interleaved with the plain calls above",
            "execd_isolate": iso,
            "over_plain_p50": round(iso["p50_ms"] / ex["p50_ms"] - 1.0, 3),
            "over_plain_mean": round(iso["mean_ms"] / ex["mean_ms"] - 1.0, 3),
        },
        "one_mib_output": {
            "command": ONE_MIB_CMD,
            "execd": summary(mib_t),
            "baseline_bash_c": summary(mib_base_t),
            "execd_answer": {
                "output_bytes": answer["output_bytes"],
                "returned_chars": len(answer["output"]),
                "truncated": answer["truncated"],
            },
        },
        "execd_rss": {
            "idle_after_warmup": idle,
            "after_benchmark": after,
            "bare_interpreter_VmRSS_KiB": bare_interpreter_rss(),
            "note": "VmRSS of execd after 100 warm-up calls; bare_interpreter is "
            "`python3 -c pass` with the same interpreter and site, for scale",
        },
        "targets": {
            "execd_p50_le_1ms": ex["p50_ms"] <= 1.0,
            "speedup_ge_2x": base["p50_ms"] / ex["p50_ms"] >= 2.0,
            "idle_rss_le_20MiB": idle["VmRSS_KiB"] <= 20 * 1024,
            "isolated_le_10pct_over_plain_p50": iso["p50_ms"] <= 1.1 * ex["p50_ms"],
        },
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
