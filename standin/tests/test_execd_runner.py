"""The stand-in's real-execd mode: every execd it spawns is reaped when the cluster stops."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from standin import StandinCluster
from standin.tests.conftest import NS, core_for, pod


def _execd_that_never_listens(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in for the interpreter: reports its pid through a fifo, then blocks forever.

    Opening the fifo for writing blocks until the test opens it for reading, so once the
    test has read the pid the process exists and has not printed ``listening on``; it then
    waits on the same fifo, which no one writes again, keeping it mid-boot until killed.
    """
    fifo = tmp_path / "pid.fifo"
    os.mkfifo(fifo)
    script = tmp_path / "fake-python"
    script.write_text(f'#!/bin/sh\necho $$ > "{fifo}"\nexec cat "{fifo}"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, fifo


def test_stop_reaps_an_execd_that_is_still_booting(
    make_cluster: Callable[..., StandinCluster], tmp_path: Path
) -> None:
    script, fifo = _execd_that_never_listens(tmp_path)
    cluster = make_cluster(nodes=1, run_execd=True, execd_python=str(script))
    core = core_for(cluster)
    try:
        body = pod("booting")
        # python3 on the container's PATH is the runtime's interpreter: here the fake one.
        body["spec"]["containers"][0]["command"] = ["python3", "-I", "-c", "pass"]
        core.create_namespaced_pod(NS, body)
        with open(fifo) as fh:  # returns once the fake execd has been spawned
            pid = int(fh.read().strip())
        assert Path(f"/proc/{pid}").exists()
        cluster.stop()
    finally:
        core.api_client.close()
    # stop() waits for every execd it started, so the child is reaped, not a zombie.
    assert not Path(f"/proc/{pid}").exists()
