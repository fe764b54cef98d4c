"""A real execd for the tests of its clients: ``python3 -m execd --port 0`` as execd's own
tests start it, stopped (and required to exit cleanly) when the test is done."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from execd.tests.helpers import REPO_ROOT, TOKEN, Execd


@contextlib.contextmanager
def running_execd(tmp_path: Path, *, host: str = "127.0.0.1") -> Iterator[Execd]:
    """One execd with the token ``execd.tests.helpers.TOKEN``, its workspace and run
    directory under ``tmp_path``; on ``host`` (loopback) at ``Execd.port``."""
    ws = tmp_path / "ws"
    ws.mkdir()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    argv = [sys.executable, "-m", "execd", "--host", host, "--port", "0"]
    argv += ["--token-file", str(token_file)]
    argv += ["--workspace", str(ws), "--run-dir", str(tmp_path / "run"), "--kill-grace", "0.3"]
    argv += ["--probe-egress-target", "127.0.0.1:9", "--probe-egress-timeout", "0.2"]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ, PYTHONPATH=REPO_ROOT),
        cwd=str(tmp_path),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.startswith("listening on "), line
    daemon = Execd(proc, int(line.rsplit(":", 1)[1]), str(ws), str(tmp_path / "run"))
    try:
        yield daemon
    finally:
        assert daemon.stop() == 0
