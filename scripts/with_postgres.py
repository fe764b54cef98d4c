#!/usr/bin/env python3
"""Run a command against a throwaway PostgreSQL cluster, then remove the cluster.

Usage: ``python scripts/with_postgres.py [--port N] -- COMMAND ARGS...``

The cluster lives in a temp dir owned by the ``postgres`` user (initdb refuses root),
``postgres`` runs as a DIRECT child of this script (PID 1 on our machines does not reap
orphans, so no ``pg_ctl``/daemonising), and it is stopped with SIGINT and ``wait()`` on
every exit path. The command gets ``DATABASE_URL`` pointing at the cluster's socket.
Standard library only, so it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PG_BIN_CANDIDATES = [Path("/usr/lib/postgresql/15/bin"), Path("/usr/lib/postgresql/16/bin")]


def find_bin() -> Path:
    override = os.environ.get("SANDMAN_PG_BIN")
    if override:
        return Path(override)
    for candidate in PG_BIN_CANDIDATES:
        if (candidate / "postgres").exists():
            return candidate
    found = shutil.which("postgres")
    if found:
        return Path(found).parent
    sys.exit("with_postgres: no PostgreSQL server binaries found (install postgresql-15)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_as(user: str, argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
    if os.geteuid() == 0:
        entry = pwd.getpwnam(user)
        return subprocess.run(argv, user=entry.pw_uid, group=entry.pw_gid, check=True, **kwargs)
    return subprocess.run(argv, check=True, **kwargs)


def wait_ready(bin_dir: Path, sock_dir: Path, port: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"postgres exited early with {proc.returncode}")
        ok = subprocess.run(
            [str(bin_dir / "pg_isready"), "-h", str(sock_dir), "-p", str(port), "-q"],
            check=False,
        )
        if ok.returncode == 0:
            return
        time.sleep(0.05)  # poll interval while the server starts; bounded by the deadline
    raise RuntimeError("postgres did not accept connections within 30 s")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--user", default="postgres")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give a command after --")

    bin_dir = find_bin()
    port = args.port or free_port()
    root = Path(tempfile.mkdtemp(prefix="sandman-pg-"))
    data = root / "data"
    root.chmod(0o755)
    if os.geteuid() == 0:
        entry = pwd.getpwnam(args.user)
        os.chown(root, entry.pw_uid, entry.pw_gid)
    server: subprocess.Popen | None = None
    try:
        run_as(
            args.user,
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
            stdout=subprocess.DEVNULL,
        )
        popen_kwargs: dict[str, object] = {}
        if os.geteuid() == 0:
            entry = pwd.getpwnam(args.user)
            popen_kwargs = {"user": entry.pw_uid, "group": entry.pw_gid}
        log = open(root / "postgres.log", "wb")  # noqa: SIM115 - closed in finally via server
        server = subprocess.Popen(
            [
                str(bin_dir / "postgres"),
                "-D",
                str(data),
                "-p",
                str(port),
                "-k",
                str(root),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=300",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            **popen_kwargs,
        )
        wait_ready(bin_dir, root, port, server)
        env = dict(os.environ)
        env["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{port}/postgres"
        print(f"with_postgres: PostgreSQL on 127.0.0.1:{port} (data in {data})", flush=True)
        child = subprocess.Popen(command, env=env)
        try:
            return child.wait()
        except KeyboardInterrupt:
            child.send_signal(signal.SIGINT)
            return child.wait()
    finally:
        if server is not None and server.poll() is None:
            server.send_signal(signal.SIGINT)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
