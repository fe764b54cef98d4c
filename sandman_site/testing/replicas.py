"""Service replicas as real processes for tests: Daphne with the production settings.

Each replica is ``daphne sandman_site.asgi:application`` (or, split, ``manage.py
run_controller`` and uvicorn; ``ControllerProcess`` alone) as a direct child of the test,
on the test's PostgreSQL database (``DATABASE_URL`` pointed at the test database), with
whatever environment the test adds (backend, Lease timing, Redis). Stopped with SIGINT
(then SIGKILL), terminated with SIGTERM, or killed with SIGKILL; always waited for.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import connection

from sandman_site.diagnostics import DUMP_SIGNAL, END

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def replica_database_url() -> str:
    """``DATABASE_URL`` pointed at the test database this test's rows live in."""
    parts = urllib.parse.urlsplit(os.environ["DATABASE_URL"])
    return urllib.parse.urlunsplit(parts._replace(path="/" + connection.settings_dict["NAME"]))


def production_env(extra: dict[str, str]) -> dict[str, str]:
    """A service process's environment: this one's, the production settings on the test's
    database, then ``extra`` (which overrides them)."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "sandman_site.settings.production",
        # The test process's key: sessions it logs in are valid on the replicas.
        "SANDMAN_SECRET_KEY": settings.SECRET_KEY,
        "DATABASE_URL": replica_database_url(),
        "SANDMAN_DB_POOL_MIN": "1",
        "SANDMAN_LOG_LEVEL": "WARNING",
        **extra,
    }


def tail(log: IO[str], chars: int) -> str:
    """The last ``chars`` characters a process wrote to its log file so far."""
    log.seek(0)
    return log.read()[-chars:]


class StuckStop(UserWarning):
    """A service process that had not ended ``timeout_s`` after its SIGINT: a bug in its
    orderly stop. Its message holds the end of the process's log, with the stacks of its
    threads (``sandman_site.diagnostics``) printed just before it was killed."""


DUMP_WAIT_S = 5.0  # at most, for the whole dump (``END``); the process is killed after


def interrupt(
    proc: subprocess.Popen[Any], timeout_s: float = 30, *, log: Callable[[], str] | None = None
) -> None:
    """SIGINT (an orderly stop), SIGKILL if it has not ended within ``timeout_s``; waited.
    One that had to be killed is reported as a :class:`StuckStop` warning, with its threads'
    stacks (asked for with SIGUSR1 first) in ``log()``'s text."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(DUMP_SIGNAL)
            until = time.monotonic() + DUMP_WAIT_S  # a process stuck outside Python never dumps
            while log is not None and END not in log() and time.monotonic() < until:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.05)  # it may still end by itself meanwhile
            proc.kill()
            proc.wait()
            tail = log() if log is not None else "(no log)"
            warnings.warn(
                StuckStop(f"{proc.args!r} had not ended {timeout_s} s after SIGINT:\n{tail}"),
                stacklevel=2,
            )


def terminate(proc: subprocess.Popen[Any], timeout_s: float) -> int:
    """SIGTERM (what the kubelet sends first) and wait for the exit; its code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=timeout_s)


class Replica:
    """One service process (Daphne) as a direct child; SIGKILL or SIGINT, always waited.
    ``env`` is added to (and overrides) the production defaults above."""

    def __init__(
        self, identity: str, env: dict[str, str], log_dir: Path, *, log_name: str = ""
    ) -> None:
        self.identity = identity
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (log_dir / f"{log_name or identity}.log").open("w+")
        env = production_env(env)
        argv = ["-m", "daphne", "-b", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(
            [sys.executable, *argv, "sandman_site.asgi:application"],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def output(self, chars: int = 4000) -> str:
        return tail(self.log, chars)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def terminate(self, timeout_s: float = 120) -> int:
        """SIGTERM (what the kubelet sends first) and wait for the exit; its code."""
        return terminate(self.proc, timeout_s)

    def stop(self) -> None:
        interrupt(self.proc, log=lambda: self.output(12000))
        self.log.close()


def status_of(replica: Replica, path: str) -> int | None:
    try:
        with urllib.request.urlopen(replica.url + path, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)
    except OSError:
        return None  # not listening yet


class Api:
    """REST calls as a trainer: JSON in, ``(status, body)`` out."""

    def __init__(self, token: str) -> None:
        self.headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}

    def call(self, replica: Replica, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            replica.url + path, data=data, method=method, headers=self.headers
        )
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                return answer.status, json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as refused:
            return refused.code, json.loads(refused.read() or b"null")


class ControllerProcess:
    """``manage.py run_controller`` alone as a direct child (split processes, §3.1), on the
    socket ``<log_dir>/<identity>.sock``. ``listening`` is set once it printed that its
    socket listens (a standby: only once it leads); SIGTERM with ``terminate``, always
    waited for in ``stop``."""

    def __init__(self, identity: str, env: dict[str, str], log_dir: Path) -> None:
        self.identity = identity
        self.socket = log_dir / f"{identity}.sock"
        self.log = (log_dir / f"{identity}.log").open("w+")
        self.listening = threading.Event()
        env = production_env({"SANDMAN_CONTROLLER_SOCKET": str(self.socket), **env})
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "run_controller"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self._reader = threading.Thread(target=self._read, name=f"{identity}-stdout")
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:  # ends when the process closes its stdout
            if b"listening" in line:
                self.listening.set()

    def output(self, chars: int = 4000) -> str:
        return tail(self.log, chars)

    def terminate(self, timeout_s: float = 120) -> int:
        """SIGTERM (what the kubelet sends first) and wait for the exit; its code."""
        return terminate(self.proc, timeout_s)

    def stop(self) -> None:
        interrupt(self.proc, log=lambda: self.output(12000))
        self._reader.join(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.log.close()


class SplitService:
    """The production layout of split processes (architecture §3.1) as direct children:
    ``manage.py run_controller`` on a Unix socket, then ``uvicorn --workers N`` whose
    workers call it. ``kill_workers()`` SIGKILLs every web worker (uvicorn's supervisor
    starts new ones); ``stop()`` stops the server, then the controller, and waits."""

    def __init__(self, env: dict[str, str], log_dir: Path, *, workers: int = 2) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (log_dir / "split.log").open("w+")
        env = production_env({"SANDMAN_CONTROLLER_SOCKET": str(log_dir / "controller.sock"), **env})
        self.controller = subprocess.Popen(
            [sys.executable, "manage.py", "run_controller"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self.server: subprocess.Popen[bytes] | None = None
        assert self.controller.stdout is not None
        if b"listening" not in self.controller.stdout.readline():  # once reconciled
            self.stop()
            raise RuntimeError(f"the controller process did not start: {self.output()}")
        argv = ["-m", "uvicorn", "--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["--workers", str(workers), "--log-level", "warning"]
        self.server = subprocess.Popen(
            [sys.executable, *argv, "sandman_site.asgi:application"],
            cwd=REPO,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def output(self, chars: int = 4000) -> str:
        return tail(self.log, chars)

    def workers(self) -> list[int]:
        """The web worker processes' pids (the uvicorn supervisor's spawned children; not
        multiprocessing's resource tracker)."""
        assert self.server is not None
        children = Path(f"/proc/{self.server.pid}/task/{self.server.pid}/children")
        workers = []
        for pid in children.read_text().split():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue  # ended meanwhile
            if b"spawn_main" in cmdline:
                workers.append(int(pid))
        return workers

    def kill_workers(self) -> list[int]:
        killed = self.workers()
        for pid in killed:
            os.kill(pid, signal.SIGKILL)  # the supervisor reaps and replaces them
        return killed

    def stop(self) -> None:
        for proc in (self.server, self.controller):
            if proc is not None:
                interrupt(proc, log=lambda: self.output(12000))
        if self.controller.stdout is not None:
            self.controller.stdout.close()
        self.log.close()
