"""execd latency benchmark: ``echo hi`` through execd vs a fresh bash per call.

Runs, in one process and side by side (interleaved: every round runs a block of each
kind in a freshly shuffled order, so machine load and the previous call's traces in
caches and run queues hit all kinds alike):
- N ``POST /exec {"command": "echo hi"}`` over ONE keep-alive HTTP connection
  (token check and syntax check included, as in production);
- N ``subprocess.run(["bash", "-c", "echo hi"])``, the fork-per-command baseline.
- N ``echo hi`` with ``isolate: true`` (issue 14), interleaved with the plain calls.
- N ``echo hi`` with ``stream: true`` (issue 14), read and decoded frame by frame as the
  trainer client does, interleaved with the plain calls.
- N ``echo hi`` and N ``( echo hi )`` sent to a bare persistent bash (job control on, as
  execd's; an end marker on its own pipe), the second baseline of ``isolate``: what one
  fork of a bash costs here without execd around it.
Also reports the RSS of an idle execd, the latency of a 1 MiB answer, and a 100 MiB
streamed output: its rate to the client and execd's peak RSS meanwhile (VmHWM after
resetting it through /proc/PID/clear_refs, plus VmRSS sampled every 10 ms), beside a
``bash -c`` whose pipe the benchmark drains itself.

Writes bench/results/execd_latency.json and prints it.
Usage: python bench/execd_latency.py [--calls 1000] [--block 1]
"""

import argparse
import datetime
import http.client
import json
import os
import platform
import random
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
STREAM_MIB = 100
STREAM_CMD = f"head -c {STREAM_MIB << 20} /dev/zero"

sys.path.insert(0, REPO)
from execd import streaming  # noqa: E402  (the frame decoder the client uses)


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
                "--max-output-bytes",  # room for the 100 MiB stream; plain calls unchanged
                str(128 << 20),
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

    def stream(self, command: str) -> tuple[int, dict[str, Any]]:
        """A ``stream: true`` call read to its end; (output bytes received, final frame)."""
        body = json.dumps({"command": command, "stream": True})
        self.conn.request("POST", "/exec", body, self.headers)
        resp = self.conn.getresponse()
        assert resp.status == 200, resp.read()
        decoder = streaming.StreamDecoder()
        received, final = 0, None
        while True:
            data = resp.read1(1 << 20)
            if not data:
                break
            for event in decoder.feed(data):
                if event.kind == streaming.OUTPUT:
                    received += len(event.data)
                else:
                    final = event.json()
        decoder.close()
        assert final is not None and final["exit_code"] == 0, final
        return received, final

    def stop(self) -> None:
        self.conn.close()
        self.proc.terminate()
        self.proc.wait(30)


class BareBash:
    """A persistent ``bash --noprofile --norc`` with ``set -m`` (as execd's shell), fed
    lines on stdin; each line ends by writing a marker to fd 3, which we read."""

    def __init__(self) -> None:
        self.marker_r, marker_w = os.pipe()
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            pass_fds=(marker_w,),
            bufsize=0,
            start_new_session=True,
        )
        os.close(marker_w)
        self.send(f"exec 3>&{marker_w} {marker_w}>&-; set -m")

    def send(self, line: str) -> None:
        self.proc.stdin.write((line + "; printf 'E\\n' >&3\n").encode())  # type: ignore[union-attr]
        got = b""
        while not got.endswith(b"E\n"):
            got += os.read(self.marker_r, 64)

    def run(self, command: str) -> None:
        self.send(command)
        out = os.read(self.proc.stdout.fileno(), 64)  # type: ignore[union-attr]  # before the marker
        assert out == b"hi\n", out

    def stop(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(30)
        os.close(self.marker_r)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def stream_big(d: Execd, runs: int) -> dict[str, Any]:
    """``runs`` streams of STREAM_MIB MiB, each beside a bash -c whose pipe we drain."""
    import threading

    try:  # reset VmHWM so it shows this part's peak, not an earlier one
        with open(f"/proc/{d.proc.pid}/clear_refs", "w") as f:
            f.write("5")
        hwm_reset = True
    except OSError:
        hwm_reset = False
    peak = [0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.01):
            peak[0] = max(peak[0], status_kib(d.proc.pid)["VmRSS_KiB"])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rates: list[float] = []
    base_rates: list[float] = []
    final: dict[str, Any] = {}
    size = STREAM_MIB << 20
    try:
        for _ in range(runs):
            t0 = time.perf_counter()
            received, final = d.stream(STREAM_CMD)
            rates.append(STREAM_MIB / (time.perf_counter() - t0))
            assert received == size, received
            t0 = time.perf_counter()
            proc = subprocess.Popen(["bash", "-c", STREAM_CMD], stdout=subprocess.PIPE)
            got = 0
            while chunk := proc.stdout.read1(1 << 20):  # type: ignore[union-attr]
                got += len(chunk)
            proc.wait()
            base_rates.append(STREAM_MIB / (time.perf_counter() - t0))
            assert got == size
    finally:
        stop.set()
        sampler.join()
    hwm = status_kib(d.proc.pid)["VmHWM_KiB"]
    return {
        "command": STREAM_CMD,
        "runs": runs,
        "execd_stream": {
            "MiB_per_s": [round(r, 1) for r in rates],
            "MiB_per_s_median": round(statistics.median(rates), 1),
            "final_frame": {k: final[k] for k in ("output_bytes", "dropped_bytes", "truncated")},
        },
        "baseline_bash_c_pipe": {
            "MiB_per_s": [round(r, 1) for r in base_rates],
            "MiB_per_s_median": round(statistics.median(base_rates), 1),
        },
        "execd_peak_rss_KiB": max(peak[0], hwm if hwm_reset else 0),
        "execd_VmHWM_KiB": hwm,
        "VmHWM_reset_before": hwm_reset,
        "execd_VmRSS_sampled_max_KiB": peak[0],
        "note": "client-side wall time from the request to the final frame over the same "
        "keep-alive connection; execd started with --max-output-bytes 128 MiB so the whole "
        "output is streamed",
    }


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
    ap.add_argument("--block", type=int, default=1)
    ap.add_argument("--seed", type=int, default=14, help="of the per-round shuffle")
    ap.add_argument("--mib-calls", type=int, default=50)
    ap.add_argument("--stream-runs", type=int, default=5)
    ap.add_argument("--out", default=OUT, help="where the JSON goes")
    args = ap.parse_args()
    info = machine()
    with tempfile.TemporaryDirectory(prefix="execd-bench-") as tmp:
        d = Execd(tmp)
        bare = BareBash()
        try:
            for _ in range(100):  # warm-up: code paths, page cache, the shell
                d.exec("echo hi")
                d.exec("echo hi", isolate=True)
                d.stream("echo hi")
                bare.run("echo hi")
                bare.run("( echo hi )")
                subprocess.run(["bash", "-c", "echo hi"], capture_output=True, check=True)
            idle = status_kib(d.proc.pid)
            kinds: dict[str, Callable[[], Any]] = {
                "execd": lambda: d.exec("echo hi"),
                "isolate": lambda: d.exec("echo hi", isolate=True),
                "stream": lambda: d.stream("echo hi"),
                "bare_echo": lambda: bare.run("echo hi"),
                "bare_subshell": lambda: bare.run("( echo hi )"),
                "bash_c": lambda: subprocess.run(
                    ["bash", "-c", "echo hi"], capture_output=True, check=True
                ),
            }
            times: dict[str, list[float]] = {k: [] for k in kinds}
            order = list(kinds)
            rng = random.Random(args.seed)
            while len(times["execd"]) < args.calls:
                # a fresh order each round: a rotation would keep each kind behind the same
                # neighbour (the plain call always after the bash -c fork and exec)
                rng.shuffle(order)
                for name in order:
                    for _ in range(min(args.block, args.calls - len(times[name]))):
                        times[name].append(timed(kinds[name]))
            execd_t, iso_t, str_t, base_t = (
                times[k] for k in ("execd", "isolate", "stream", "bash_c")
            )
            mib_t: list[float] = []
            mib_base_t: list[float] = []
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
            big = stream_big(d, args.stream_runs)
            after = status_kib(d.proc.pid)
        finally:
            d.stop()
            bare.stop()
    ex, base, iso, st = summary(execd_t), summary(base_t), summary(iso_t), summary(str_t)
    bare_echo, bare_sub = summary(times["bare_echo"]), summary(times["bare_subshell"])
    fork_p50 = bare_sub["p50_ms"] - bare_echo["p50_ms"]
    iso_extra_p50 = iso["p50_ms"] - ex["p50_ms"]
    result = {
        "benchmark": "execd_latency",
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": dict(info, loadavg_at_end=list(os.getloadavg())),
        "method": (
            f"{args.calls} calls of each kind in rounds of {args.block} per kind, the kinds' "
            f"order shuffled each round (seed {args.seed}), after 100 warm-up rounds; execd: "
            'POST /exec {"command": "echo hi"} over one keep-alive '
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
            "extra_over_plain_p50_ms": round(iso_extra_p50, 4),
            "baseline_bare_bash": {
                "note": "a bare persistent bash (set -m) fed `echo hi` and `( echo hi )` "
                "lines on stdin, each ending with a marker written to fd 3 that we read; "
                "interleaved with the calls above",
                "echo": bare_echo,
                "subshell": bare_sub,
                "fork_cost_p50_ms": round(fork_p50, 4),
            },
            "extra_beyond_a_bare_fork_p50_ms": round(iso_extra_p50 - fork_p50, 4),
        },
        "echo_hi_streamed": {
            "note": 'POST /exec {"command": "echo hi", "stream": true}: chunked frames read '
            "with read1 and execd.streaming.StreamDecoder to the final frame, interleaved "
            "with the plain calls above",
            "execd_stream": st,
            "over_plain_p50": round(st["p50_ms"] / ex["p50_ms"] - 1.0, 3),
            "over_plain_mean": round(st["mean_ms"] / ex["mean_ms"] - 1.0, 3),
        },
        "stream_100mib": big,
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
            "streamed_le_10pct_over_plain_p50": st["p50_ms"] <= 1.1 * ex["p50_ms"],
            "stream_ge_200MiB_per_s": big["execd_stream"]["MiB_per_s_median"] >= 200.0,
            "stream_execd_peak_rss_le_32MiB": big["execd_peak_rss_KiB"] <= 32 * 1024,
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
