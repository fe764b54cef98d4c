"""A PostgreSQL cluster a test owns, so it can stop and start it (chaos tests).

The same recipe as ``scripts/with_postgres.py``: initdb as the ``postgres`` user (initdb
refuses root), the server a DIRECT child of this process (PID 1 here does not reap), stop
with a signal and ``wait()``. ``stop`` then ``start`` is a real restart: same data
directory, same port, every client connection dropped in between.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

_BIN_CANDIDATES = [Path("/usr/lib/postgresql/15/bin"), Path("/usr/lib/postgresql/16/bin")]


def pg_bin() -> Path | None:
    for candidate in _BIN_CANDIDATES:
        if (candidate / "postgres").exists():
            return candidate
    found = shutil.which("postgres")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgCluster:
    def __init__(self, bin_dir: Path) -> None:
        self.bin = bin_dir
        self.root = Path(tempfile.mkdtemp(prefix="sandman-pgchaos-"))
        self.root.chmod(0o755)
        self.port = _free_port()
        self._as: dict[str, Any] = {}
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self._as = {"user": entry.pw_uid, "group": entry.pw_gid}
        self.proc: subprocess.Popen[bytes] | None = None
        subprocess.run(
            [str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "-A", "trust"]
            + ["-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            **self._as,
        )

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, timeout_s: float = 30.0) -> None:
        log = open(self.root / "postgres.log", "ab")  # noqa: SIM115 - the child holds it
        self.proc = subprocess.Popen(
            [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port)]
            + ["-k", str(self.root), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
            stdout=log,
            stderr=subprocess.STDOUT,
            **self._as,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while True:  # polled with a deadline until it accepts connections
            ready = subprocess.run(
                [str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), "-q"],
                check=False,
            )
            if ready.returncode == 0:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not start: {self.log_tail()}")
            time.sleep(0.05)

    def stop(self, sig: int = signal.SIGINT) -> None:
        """SIGINT: fast shutdown (every session is terminated); SIGKILL: a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(60)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def log_tail(self) -> str:
        try:
            return (self.root / "postgres.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""
