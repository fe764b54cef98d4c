"""Where a stuck service process is (``sandman_site.diagnostics``).

* A real Daphne service process (production settings, no controller) prints every
  thread's stack on SIGUSR1 and keeps serving.
* The test harness's ``interrupt`` reports a process that outlived its SIGINT as a
  ``StuckStop`` warning carrying those stacks, and kills it: here a process that ignores
  SIGINT (it can never end by itself, so the timeout decides nothing but how long the
  test waits).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sandman_site.diagnostics import DUMP_SIGNAL, END
from sandman_site.testing.replicas import REPO, Replica, StuckStop, interrupt, status_of
from standin.harness.support import wait_until

IGNORES_SIGINT = """
import signal, sys, threading
from sandman_site.diagnostics import enable_stack_dumps
enable_stack_dumps()
signal.signal(signal.SIGINT, signal.SIG_IGN)
def parked_in_a_thread():
    threading.Event().wait()
threading.Thread(target=parked_in_a_thread, name="parked", daemon=True).start()
print("ready", flush=True)
threading.Event().wait()
"""


@pytest.mark.skipif(not os.environ.get("DATABASE_URL"), reason="a replica needs PostgreSQL")
@pytest.mark.django_db(transaction=True)
def test_a_service_process_prints_every_threads_stack_on_sigusr1_and_keeps_serving() -> None:
    replica = Replica("dumps", {"SANDMAN_CONTROLLER_AUTOSTART": "false"}, Path(tempfile.mkdtemp()))
    try:
        wait_until(lambda: status_of(replica, "/healthz") == 200, what="the replica to serve")
        assert END not in replica.output(100_000)
        os.kill(replica.proc.pid, DUMP_SIGNAL)
        dump = wait_until(
            lambda: END in replica.output(100_000) and replica.output(100_000),
            what="the whole dump on stderr",
        )
        assert "thread 'MainThread'" in dump, dump
        assert "twisted" in dump, dump  # Daphne's reactor, in the main thread
        assert replica.proc.poll() is None
        assert status_of(replica, "/healthz") == 200
    finally:
        replica.stop()
    assert replica.proc.returncode is not None


def test_a_process_that_outlives_its_sigint_is_killed_and_reported_with_its_stacks(
    tmp_path: Path,
) -> None:
    log = (tmp_path / "stuck.log").open("w+")
    proc = subprocess.Popen(
        [sys.executable, "-c", IGNORES_SIGINT],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=log,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"  # its handlers are in place

    def read() -> str:
        log.seek(0)
        return log.read()

    with pytest.warns(StuckStop) as reported:
        interrupt(proc, timeout_s=0.5, log=read)
    assert proc.returncode == -signal.SIGKILL
    message = str(reported[0].message)
    assert "had not ended 0.5 s after SIGINT" in message
    assert "parked_in_a_thread" in message  # every thread's stack, not only the main one
    proc.stdout.close()
    log.close()
