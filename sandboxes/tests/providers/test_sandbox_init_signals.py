"""sandbox_init under SIGTERM: however many arrive, and whenever, execd and what it started
are killed and reaped before sandbox_init exits.

The provider's death can bring several SIGTERMs: PR_SET_PDEATHSIG follows the THREAD that
spawned sandbox_init, and as each of the provider's threads dies it is re-parented to the
next and signalled again. Each test runs sandbox_init (its real ``main``) through a driver
that can make one extra SIGTERM arrive at the last moment before sandbox_init ignores
SIGTERM, the end of the window in which a SIGTERM still raises. It is sent with
``pthread_kill`` to the calling thread, so it is handled before that call returns: no
timing is involved. The fake execd forks a child that never exits on its own (a command
it started) and writes both pids to the workspace before it reports listening.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from sandboxes.providers.local import procs
from sandboxes.providers.local.runtime import INIT_SCRIPT

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

DRIVER = """
import os, signal, sys, threading

init_dir, late_sigterm = sys.argv[1], sys.argv[2] == "late-sigterm"
sys.path.insert(0, init_dir)
import sandbox_init

if late_sigterm:
    real_signal = signal.signal
    sent = []

    def signal_then(signum, handler):
        if signum == signal.SIGTERM and handler == signal.SIG_IGN and not sent:
            sent.append(True)  # one more SIGTERM, just before it would be ignored
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        return real_signal(signum, handler)

    signal.signal = signal_then
sys.exit(sandbox_init.main(sys.argv[3:]))
"""

FAKE_EXECD = """
import os, signal, sys

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
workspace = sys.argv[sys.argv.index("--workspace") + 1]
child = os.fork()
if child == 0:
    while True:  # a command execd started: only SIGKILL (or SIGTERM) ends it
        signal.pause()
with open(os.path.join(workspace, "pids"), "w") as handle:
    handle.write(f"{os.getpid()} {child}")
sys.stdout.write("listening on 127.0.0.1:1\\n")
sys.stdout.flush()
signal.sigwait({signal.SIGUSR1})  # the test ends execd on its own with SIGUSR1
"""


class Sandbox:
    """sandbox_init run by the driver, with the fake execd up and its pids known."""

    def __init__(self, tmp: Path, *, late_sigterm: bool) -> None:
        (tmp / "execd_dir" / "execd").mkdir(parents=True)
        (tmp / "execd_dir" / "execd" / "__init__.py").write_text("")
        (tmp / "execd_dir" / "execd" / "__main__.py").write_text(FAKE_EXECD)
        (tmp / "workspace").mkdir()
        (tmp / "private").mkdir(mode=0o700)
        (tmp / "driver.py").write_text(DRIVER)
        token_r, token_w = os.pipe()
        ready_r, ready_w = os.pipe()
        os.write(token_w, b"token")
        os.close(token_w)
        self.stderr = tempfile.TemporaryFile()  # not a pipe: survivors would hold it open
        argv = [sys.executable, "-I", str(tmp / "driver.py"), str(INIT_SCRIPT.parent)]
        argv += ["late-sigterm" if late_sigterm else "plain"]
        argv += ["--token-fd", str(token_r), "--token-file", str(tmp / "private" / "token")]
        argv += ["--unlink-token", "--ready-fd", str(ready_w)]
        argv += ["--workspace", str(tmp / "workspace"), "--execd-dir", str(tmp / "execd_dir")]
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self.stderr,
                pass_fds=(token_r, ready_w),
            )
        finally:
            os.close(token_r)
            os.close(ready_w)
        try:
            ready = b""
            while not ready.endswith(b"\n"):
                chunk = os.read(ready_r, 4096)
                if not chunk:
                    break
                ready += chunk
        finally:
            os.close(ready_r)
        assert ready == b"listening on 127.0.0.1:1\n", (ready, self.output())
        self.execd, self.command = map(int, (tmp / "workspace" / "pids").read_text().split())
        self.started = {pid: procs.start_time(pid) for pid in (self.execd, self.command)}

    def output(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")

    def running(self) -> list[int]:
        return [pid for pid, started in self.started.items() if procs.is_ours(pid, started)]

    def close(self) -> None:
        for pid, started in self.started.items():
            procs.send(pid, started, signal.SIGKILL)  # survivors of a failed test
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.close()


@pytest.mark.parametrize("late_sigterm", [False, True], ids=["once", "and-again"])
def test_sigterm_kills_and_reaps_execd_and_its_commands_even_if_another_follows(
    tmp_path: Path, late_sigterm: bool
) -> None:
    sandbox = Sandbox(tmp_path, late_sigterm=late_sigterm)
    try:
        assert sandbox.running() == [sandbox.execd, sandbox.command]
        sandbox.proc.send_signal(signal.SIGTERM)  # the provider died
        code = sandbox.proc.wait(timeout=120)
        assert sandbox.running() == [], sandbox.output()
        assert code == 0, sandbox.output()
    finally:
        sandbox.close()


def test_a_sigterm_as_execd_ends_on_its_own_still_kills_and_reaps_its_commands(
    tmp_path: Path,
) -> None:
    sandbox = Sandbox(tmp_path, late_sigterm=True)
    try:
        os.kill(sandbox.execd, signal.SIGUSR1)  # execd ends; the provider dies meanwhile
        code = sandbox.proc.wait(timeout=120)
        assert sandbox.running() == [], sandbox.output()
        assert code == 0, sandbox.output()
    finally:
        sandbox.close()
