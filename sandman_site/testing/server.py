"""The real service in a process of its own, for tests that speak to it over HTTP.

``ServedProcess`` runs ``daphne sandman_site.asgi:application`` (the production ASGI app:
the fast path, the middlewares, the controller) on a free loopback port against the
database the test process uses (pytest-django's test database: commit data with
``transactional_db`` so the server sees it). It is a separate process on purpose: what
it answers is what a client across the network gets, and per-process caches are really
per process.

Invariant: ``stop()`` ends the process it started (SIGTERM, then SIGKILL after a
deadline) and reaps it; nothing else is signalled.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

from django.db import connection

ROOT = Path(__file__).resolve().parent.parent.parent


def served_database_url() -> str:
    """``DATABASE_URL`` naming the database this process's default connection uses."""
    settings_dict = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{settings_dict['NAME']}"
    user = quote(settings_dict.get("USER") or "")
    password = quote(settings_dict.get("PASSWORD") or "")
    auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
    host = settings_dict.get("HOST") or ""
    port = settings_dict.get("PORT") or ""
    name = quote(settings_dict["NAME"])
    if host.startswith("/"):
        return f"postgres://{auth}/{name}?host={quote(host)}"
    return f"postgres://{auth}{host}{':' + port if port else ''}/{name}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServedProcess:
    """One daphne process serving Sandman; ``start()`` returns its base URL."""

    def __init__(self, *, env: dict[str, str] | None = None, log: IO[Any] | None = None):
        self.env = dict(env or {})
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""

    def start(self, *, deadline_s: float = 60.0) -> str:
        port = free_port()
        env = {
            **os.environ,
            # The layer a developer runs (its controller autostarts), debug off like
            # production; the test layer never starts a controller.
            "DJANGO_SETTINGS_MODULE": "sandman_site.settings.dev",
            "SANDMAN_DEBUG": "0",
            "DATABASE_URL": served_database_url(),
            **self.env,
        }
        self.process = subprocess.Popen(
            [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
            + ["sandman_site.asgi:application"],
            cwd=ROOT,
            env=env,
            stdout=self.log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT if self.log else subprocess.DEVNULL,
        )
        self.url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + deadline_s
        while True:  # poll the real condition (it answers), with a deadline
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as answer:
                    if answer.status == 200:
                        return self.url
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > end:
                self.stop()
                raise RuntimeError(f"the server did not answer within {deadline_s} s")
            time.sleep(0.1)

    def stop(self, *, deadline_s: float = 30.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(deadline_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(deadline_s)


@dataclass(frozen=True)
class Served:
    url: str
    user: Any
    token: str
    log: Path

    def errors(self) -> str:
        """The server log without its per-request warnings (4xx answers)."""
        lines = self.log.read_text().splitlines()
        return "\n".join(line for line in lines if "WARNING" not in line)[-4000:]
