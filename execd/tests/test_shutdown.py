"""SIGTERM while requests are in flight: execd shuts down in order and exits 0.

The handler only records the signal; the main thread stops the server, ends idle
connections, kills the sandbox's processes (a running command answers) and exits 0,
with nothing on stderr. Many rounds, each with connections opening all the time (so the
signal lands while request threads are starting, the race that once raised SystemExit
inside ``Thread.start``). Synchronised on a barrier and a FIFO, never on sleeps.
"""

import http.client
import os
import signal
import threading
from typing import Callable, Dict, List

import pytest

from execd.tests.helpers import Execd

CONNECTORS = 6


def _hammer(port: int, answered: threading.Barrier, counts: List[int], slot: int) -> None:
    """New connection, GET /health, close - until execd is gone."""
    first = True
    while True:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", "/health")
            resp = conn.getresponse()
            resp.read()
        except (OSError, http.client.HTTPException):
            return  # refused or cut: execd is stopping
        finally:
            conn.close()
        counts[slot] += 1
        if first:
            first = False
            answered.wait(30)


@pytest.mark.parametrize("round_", range(12))
def test_sigterm_during_concurrent_requests_exits_0_with_nothing_on_stderr(
    start_execd: Callable[..., Execd], tmp_path: "os.PathLike[str]", round_: int
) -> None:
    d = start_execd()
    fifo = os.path.join(str(tmp_path), "running")
    os.mkfifo(fifo)
    long_answer: Dict[str, object] = {}

    def long_command() -> None:
        c = d.client()
        try:
            long_answer.update(c.exec("echo go > %s; sleep 60" % fifo, timeout_s=120))
        finally:
            c.close()

    runner = threading.Thread(target=long_command)
    runner.start()
    with open(fifo) as gate:  # opens once the command writes: it is running now
        assert gate.read() == "go\n"

    answered = threading.Barrier(CONNECTORS + 1)
    counts = [0] * CONNECTORS
    hammers = [
        threading.Thread(target=_hammer, args=(d.port, answered, counts, i))
        for i in range(CONNECTORS)
    ]
    for t in hammers:
        t.start()
    answered.wait(30)  # every connector has been answered and is opening more

    d.proc.send_signal(signal.SIGTERM)
    rc = d.proc.wait(timeout=30)
    stderr = d.proc.stderr.read().decode()  # type: ignore[union-attr]
    runner.join(30)
    for t in hammers:
        t.join(30)

    assert rc == 0, stderr
    assert stderr == ""  # no traceback, no abandoned thread, no warning
    assert all(counts)
    assert long_answer["exit_code"] != 0  # killed, not waited for (sleep 60)
    assert "execd is stopping" in str(long_answer["error"])
