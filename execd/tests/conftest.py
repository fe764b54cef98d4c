"""Fixtures: a real execd subprocess (``python3 -m execd --port 0 ...``) and an
http.client keep-alive client for it. Every daemon started here is stopped
(terminate, then wait) when its test ends, and must exit cleanly.
"""

import os
import socket
import subprocess
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional

import pytest

from execd.tests.helpers import REPO_ROOT, TOKEN, Client, Execd


@pytest.fixture
def start_execd(tmp_path_factory: Any) -> Iterator[Callable[..., Execd]]:
    started = []  # type: List[Execd]

    def start(
        *extra: str,
        workspace: Optional[str] = None,
        python: str = sys.executable,
        env: Optional[Dict[str, str]] = None,
        token_args: Optional[List[str]] = None,
        listener: Optional[socket.socket] = None,
    ) -> Execd:
        base = tmp_path_factory.mktemp("execd")
        ws = workspace or str(base / "ws")
        os.makedirs(ws, exist_ok=True)
        token_file = base / "token"
        token_file.write_text(TOKEN + "\n")
        run_dir = str(base / "run")
        argv = [
            python,
            "-m",
            "execd",
            *(["--listen-fd", str(listener.fileno())] if listener else ["--port", "0"]),
            *(token_args if token_args is not None else ["--token-file", str(token_file)]),
            "--workspace",
            ws,
            "--run-dir",
            run_dir,
            "--kill-grace",
            "0.3",
            "--probe-egress-target",
            "127.0.0.1:9",
            "--probe-egress-timeout",
            "0.2",
            "--test-hooks",
        ] + list(extra)
        child_env = dict(os.environ if env is None else env)
        child_env["PYTHONPATH"] = REPO_ROOT
        proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env,
            cwd=str(base),
            pass_fds=(listener.fileno(),) if listener else (),
        )
        line = proc.stdout.readline().decode()  # type: ignore[union-attr]
        if not line.startswith("listening on "):
            proc.kill()
            raise AssertionError("execd did not start: %r %r" % (line, proc.stderr.read().decode()))  # type: ignore[union-attr]
        port = int(line.rsplit(":", 1)[1])
        d = Execd(proc, port, ws, run_dir)
        d.listening = line.strip()
        started.append(d)
        return d

    yield start
    for d in started:
        rc = d.stop()
        assert rc == 0, "execd exited with %s: %s" % (rc, d.proc.stderr.read().decode())


@pytest.fixture
def execd(start_execd: Callable[..., Execd]) -> Execd:
    return start_execd()


@pytest.fixture
def client(execd: Execd) -> Iterator[Client]:
    c = execd.client()
    yield c
    c.close()
