#!/usr/bin/env python3
"""Benchmark: the floor of the REST hot path on this machine, beside Sandman in the same run.

Issue 13 item 6 asks for one client's warm acquire p50 <= 2 ms and, at 64 concurrent
clients, >= 500 acquire+release pairs/s with acquire p99 <= 250 ms, on 2 cores. This bench
measures what the machine itself allows, with the same server (uvicorn, 2 workers, uvloop,
httptools), the same load generator (aiohttp on the same cores, rounds of 64 concurrent
pairs, then one client's serial pairs) and the same PostgreSQL, for apps that do less than
any real design can (``bench/floor_app.py``):

* ``http``: parse and answer; no database;
* ``pg``: each acquire ONE statement (hand-out under ``FOR UPDATE SKIP LOCKED``, its
  acquisition row and its event), each release one statement;
* ``pg_health``: ``pg`` plus a ``GET /health`` of a real execd before each hand-out.

No replacement create runs (the release puts the pod back), so each floor is a bound on
what Sandman could reach with the creates' cost at zero. Beside them, in the same run,
``bench/acquire_latency.py`` measures Sandman itself (split processes, production
settings, this PostgreSQL, local backend; its own JSON is embedded whole under
``sandman``), once through the controller and once with the direct hand-out on
(``--direct``: acquires claim offered warm pods in PostgreSQL, architecture §3.6), so the
figures share the machine and its load. The load average at each
phase's start is recorded.

Results: ``bench/results/hot_path_floor.json`` (``--out``).
Usage: ``python scripts/with_postgres.py -- python bench/hot_path_floor.py
[--clients 64] [--rounds 10] [--serial 300] [--serial-gaps-ms 10,50] [--no-sandman]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from acquire_latency import client_cpu_s, free_port, host_busy_s, summary  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "hot_path_floor.json"
SPEC = {"cpu": "250m", "memory": "128Mi"}
IMAGE = "sandman/empty"
TARGETS = {
    "serial_acquire_p50_ms": 2,
    "concurrent_pairs_per_s": 500,
    "concurrent_acquire_p99_ms": 250,
}

SCHEMA = """
DROP TABLE IF EXISTS floor_event, floor_acquisition, floor_pod;
CREATE TABLE floor_pod (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL, pool_key text NOT NULL,
    state text NOT NULL, address text NOT NULL, token text NOT NULL,
    warm_since timestamptz NOT NULL DEFAULT now(), handed_at timestamptz
);
CREATE INDEX floor_pod_warm ON floor_pod (job_id, pool_key, warm_since) WHERE state = 'warm';
CREATE TABLE floor_acquisition (
    id bigserial PRIMARY KEY, job_id bigint NOT NULL,
    sandbox_id bigint REFERENCES floor_pod (id), state text NOT NULL, source text NOT NULL,
    started_at timestamptz NOT NULL, finished_at timestamptz
);
CREATE TABLE floor_event (
    id bigserial PRIMARY KEY, sandbox_id bigint NOT NULL REFERENCES floor_pod (id),
    kind text NOT NULL, at timestamptz NOT NULL
);
"""


def seed(url: str, pods: int) -> None:
    key = json.dumps([IMAGE, SPEC, "rollout"])
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SCHEMA)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO floor_pod (job_id, pool_key, state, address, token)"
                " VALUES (1, %s, 'warm', %s, %s)",
                [(key, f"127.0.0.1:{20000 + i}", secrets.token_hex(32)) for i in range(pods)],
            )


def start_execd(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """One real execd on loopback (the pod the ``pg_health`` floor checks)."""
    token = tmp / "execd-token"
    token.write_text(secrets.token_hex(32))
    workspace = tmp / "workspace"
    workspace.mkdir()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "execd",
            "--port",
            "0",
            "--token-file",
            str(token),
            "--workspace",
            str(workspace),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()  # "listening on HOST:PORT", once it listens
    if not line.startswith("listening on "):
        proc.kill()
        proc.wait()
        raise RuntimeError(f"execd did not start: {line!r}")
    return proc, "http://" + line.split()[-1]


def start_floor(mode: str, port: int, env: dict[str, str], log: Any) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "uvicorn",
        "floor_app:app",
        "--app-dir",
        "bench",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "2",
        "--loop",
        "uvloop",
        "--http",
        "httptools",
        "--log-level",
        "warning",
        "--no-access-log",
    ]
    return subprocess.Popen(
        argv, cwd=ROOT, env={**env, "FLOOR_MODE": mode}, stdout=log, stderr=subprocess.STDOUT
    )


async def wait_listening(base: str, deadline_s: float = 30.0) -> None:
    end = time.monotonic() + deadline_s
    async with aiohttp.ClientSession(base) as session:
        while True:
            try:
                async with session.get("/") as r:
                    await r.read()
                    return
            except aiohttp.ClientConnectionError:
                if time.monotonic() > end:
                    raise
                await asyncio.sleep(0.05)  # polling a starting server's port


async def load(
    base: str, token: str, clients: int, rounds: int, serial: int, gaps_ms: list[float]
) -> dict[str, Any]:
    """Rounds of CLIENTS concurrent acquire+release pairs, then SERIAL pairs of one client,
    as ``bench/acquire_latency.py`` runs them (pairs/s over the wall time inside the bursts);
    then SERIAL pairs again for each idle gap of ``gaps_ms`` before each pair (the serial
    phase of ``acquire_latency.py`` waits for the pool to refill before each pair, so the
    processes an acquire wakes have been idle)."""
    headers = {"Authorization": f"Token {token}"}
    connector = aiohttp.TCPConnector(limit=clients * 2, keepalive_timeout=2.0)
    acquire_body = {"image": IMAGE, "spec": SPEC, "role": "rollout", "timeout_s": 60}
    errors: list[str] = []

    async with aiohttp.ClientSession(base, headers=headers, connector=connector) as session:

        async def pair(acquires: list[float], releases: list[float]) -> None:
            t = time.perf_counter()
            async with session.post("/api/v1/jobs/1/acquire/", json=acquire_body) as r:
                body = await r.json()
            if r.status != 200:
                errors.append(f"acquire {r.status} {body}")
                return
            acquires.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            async with session.post(f"/api/v1/sandboxes/{body['sandbox_id']}/release/") as r:
                await r.read()
            if r.status != 200:
                errors.append(f"release {r.status}")
            releases.append((time.perf_counter() - t) * 1000)

        warm_a: list[float] = []
        for _ in range(3):  # warm the connections and both workers, unmeasured
            await asyncio.gather(*(pair(warm_a, []) for _ in range(clients)))
        acquires: list[float] = []
        releases: list[float] = []
        wall = host = client = 0.0
        for _ in range(rounds):
            h0, c0, t = host_busy_s(), client_cpu_s(), time.perf_counter()
            await asyncio.gather(*(pair(acquires, releases) for _ in range(clients)))
            wall += time.perf_counter() - t
            host += host_busy_s() - h0
            client += client_cpu_s() - c0
        serial_a: list[float] = []
        serial_r: list[float] = []
        for _ in range(serial):
            await pair(serial_a, serial_r)
        by_gap: dict[str, Any] = {}
        for gap in gaps_ms:
            gap_a: list[float] = []
            gap_r: list[float] = []
            for _ in range(serial):
                await asyncio.sleep(gap / 1000)  # idle: what is measured, not a synchronisation
                await pair(gap_a, gap_r)
            by_gap[f"{gap:g}"] = {"acquire_ms": summary(gap_a), "release_ms": summary(gap_r)}
    return {
        "concurrent": {
            "acquire_ms": summary(acquires),
            "release_ms": summary(releases),
            "pairs_per_s": round(len(releases) / wall, 1),
            "wall_s": round(wall, 3),
            "host_busy_s": round(host, 3),
            "host_busy_ms_per_pair": round(host * 1000 / max(len(releases), 1), 3),
            "load_generator_cpu_s": round(client, 3),
        },
        "serial": {"acquire_ms": summary(serial_a), "release_ms": summary(serial_r)},
        "serial_after_idle_gap_ms": by_gap,
        "error_count": len(errors),
        "errors": errors[:10],
    }


_ECHO = """
import socket, sys
server = socket.create_server(("127.0.0.1", 0))
print(server.getsockname()[1], flush=True)
conn, _ = server.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while data := conn.recv(64):
    conn.sendall(data)
"""


def idle_wake(gaps_ms: list[float], samples: int = 200) -> dict[str, Any]:
    """One loopback round trip to a process that only echoes (a bare Python socket loop, no
    HTTP, no threads), p50 in ms, back to back and after each idle gap: what waking an idle
    process costs on this machine, apart from anything the service does. An acquire of
    one client crosses processes several times (client, web worker, PostgreSQL, execd)."""
    echo = subprocess.Popen([sys.executable, "-c", _ECHO], stdout=subprocess.PIPE)
    try:
        assert echo.stdout is not None
        port = int(echo.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            out: dict[str, Any] = {}
            for gap in [0.0, *gaps_ms]:
                rtts: list[float] = []
                for _ in range(samples):
                    if gap:
                        time.sleep(gap / 1000)  # idle: what is measured, not a synchronisation
                    t = time.perf_counter()
                    sock.sendall(b"x")
                    sock.recv(64)
                    rtts.append((time.perf_counter() - t) * 1000)
                out[f"{gap:g}"] = summary(rtts)
            return {"what": idle_wake.__doc__.split("\n\n")[0].replace("\n", " "), "rtt_ms": out}
    finally:
        echo.kill()
        echo.wait()


def headline(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "serial_acquire_p50_ms": run["serial"]["acquire_ms"]["p50"],
        "concurrent_pairs_per_s": run["concurrent"]["pairs_per_s"],
        "concurrent_acquire_p99_ms": run["concurrent"]["acquire_ms"]["p99"],
    }


def run_sandman(tmp: Path, *, direct: bool) -> dict[str, Any]:
    out = tmp / f"sandman-{'direct' if direct else 'controller'}.json"
    cmd = [sys.executable, "bench/acquire_latency.py", "--out", str(out)]
    if direct:
        cmd.append("--direct")
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    (run,) = json.loads(out.read_text())["runs"].values()
    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--serial", type=int, default=300)
    parser.add_argument("--modes", default="http,pg,pg_health")
    parser.add_argument("--no-sandman", action="store_true", help="skip Sandman's own run")
    parser.add_argument(
        "--serial-gaps-ms",
        default="",
        help="comma-separated idle gaps (ms) before each serial pair, measured after the rest",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith(("postgres://", "postgresql://")):
        sys.exit("run under scripts/with_postgres.py: DATABASE_URL must name PostgreSQL")

    gaps_ms = [float(g) for g in args.serial_gaps_ms.split(",") if g.strip()]
    tmp = Path(tempfile.mkdtemp(prefix="sandman-floor-"))
    token = secrets.token_hex(20)
    execd, execd_url = start_execd(tmp)
    env = {**os.environ, "FLOOR_TOKEN": token, "FLOOR_EXECD": execd_url}
    floors: dict[str, Any] = {}
    try:
        for mode in args.modes.split(","):
            seed(url, args.clients * 2)
            port = free_port()
            with open(tmp / f"{mode}.log", "wb") as log:
                server = start_floor(mode, port, env, log)
                try:
                    base = f"http://127.0.0.1:{port}"
                    asyncio.run(wait_listening(base))
                    load_at_start = list(os.getloadavg())
                    result = asyncio.run(
                        load(base, token, args.clients, args.rounds, args.serial, gaps_ms)
                    )
                finally:
                    server.send_signal(signal.SIGINT)
                    server.wait(timeout=30)
            floors[mode] = {"load_average_at_start": load_at_start, **result}
            print(mode, json.dumps(headline(floors[mode])), flush=True)
    finally:
        execd.send_signal(signal.SIGTERM)
        execd.wait(timeout=30)
    sandman: dict[str, Any] = {}
    if not args.no_sandman:
        for name, direct in (("sandman", False), ("sandman_direct", True)):
            load_at_start = list(os.getloadavg())
            run = run_sandman(tmp, direct=direct)
            sandman[name] = {"load_average_at_start": load_at_start, **run}
            print(name, json.dumps(headline(sandman[name])), flush=True)

    out = {
        "benchmark": "hot_path_floor",
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "what": __doc__.split("\n\n")[1].replace("\n", " "),
        "server": "uvicorn --workers 2 --loop uvloop --http httptools, loopback",
        "settings": "floors: bench/floor_app.py (no Django); sandman: its own JSON below",
        "database": "postgresql (scripts/with_postgres.py: fsync off)",
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
        "clients": args.clients,
        "rounds": args.rounds,
        "serial": args.serial,
        "serial_gaps_ms": gaps_ms,
        "idle_wake": idle_wake(gaps_ms),
        "targets": TARGETS,
        "summary": {
            **{mode: headline(run) for mode, run in floors.items()},
            **{name: headline(run) for name, run in sandman.items()},
        },
        "floors": floors,
        "sandman": sandman,  # acquire_latency.py's runs: through the controller, and direct
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
