"""Real execd processes for the stand-in's ``--run-execd`` mode, one per Ready pod.

Each pod gets a directory with a token file (mode 0600, written from the pod's
``SANDMAN_EXECD_TOKEN`` env var, which is NOT passed on to execd's environment) and a
workspace. execd is started as ``python3 -m execd --port 0 --token-file F --workspace W``
(through the same ``-I -c`` runpy launcher the provider's pods use, so no ``PYTHONPATH``
leaks into the sandbox's commands) on loopback; its first stdout line
``listening on HOST:PORT`` gives the port.

Invariants (MACHINE-NOTES: orphans become zombies here): every execd is a direct child,
stopped with SIGTERM then SIGKILL and always ``wait()``ed; ``stop_all`` runs on server
shutdown; stdout is drained continuously so a chatty execd never blocks on a full pipe.
A process is tracked from the moment it is spawned (``_booting`` until its ``listening on``
line is read, then ``_running``), so a start that is cancelled or a ``stop_all`` that comes
while it boots still reaps it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from standin import keys as K

log = logging.getLogger(__name__)

_LISTENING = re.compile(rb"listening on (\S+):(\d+)")
REPO_ROOT = Path(__file__).resolve().parents[1]


class ExecdStartError(RuntimeError):
    """execd exited, printed something unexpected, or took too long to listen."""


@dataclass
class _Running:
    proc: asyncio.subprocess.Process
    directory: Path
    port: int
    drain: asyncio.Task[None]


class ExecdRunner:
    def __init__(
        self,
        *,
        python: str = sys.executable,
        pythonpath: str | None = None,
        base_dir: Path | None = None,
        startup_timeout_s: float = 20.0,
    ) -> None:
        self.python = python
        self.pythonpath = pythonpath if pythonpath is not None else str(REPO_ROOT)
        self._base = base_dir
        self._owns_base = base_dir is None
        self.startup_timeout_s = startup_timeout_s
        self._running: dict[str, _Running] = {}
        self._booting: dict[str, asyncio.subprocess.Process] = {}
        self.started_total = 0

    def _base_dir(self) -> Path:
        if self._base is None:
            self._base = Path(tempfile.mkdtemp(prefix="standin-execd-"))
        return self._base

    def ports(self) -> dict[str, int]:
        return {key: r.port for key, r in self._running.items()}

    async def start(self, key: str, token: str) -> int:
        directory = self._base_dir() / key
        workspace = directory / "workspace"
        workspace.mkdir(parents=True, exist_ok=True)
        token_file = directory / "token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token)
        env = {k: v for k, v in os.environ.items() if k != K.EXECD_TOKEN_ENV}
        # As in a pod: execd is found on a path given to the interpreter, not through
        # PYTHONPATH, so commands in the sandbox do not inherit the repository's path.
        launcher = (
            f"import runpy, sys; sys.path.insert(0, {self.pythonpath!r}); "
            "runpy.run_module('execd', run_name='__main__', alter_sys=True)"
        )
        stderr = open(directory / "execd.stderr", "wb")  # noqa: SIM115 - closed below
        try:
            proc = await asyncio.create_subprocess_exec(
                self.python,
                "-I",
                "-u",
                "-c",
                launcher,
                "--port",
                "0",
                "--token-file",
                str(token_file),
                "--workspace",
                str(workspace),
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                stdin=asyncio.subprocess.DEVNULL,
                cwd=str(directory),
                env=env,
            )
        finally:
            stderr.close()
        self._booting[key] = proc
        try:
            line = await self._first_line(proc)
        except BaseException:  # cancelled mid-boot (cluster stopping): reap it, then re-raise
            await _stop_process(proc)
            raise
        finally:
            self._booting.pop(key, None)
        match = _LISTENING.search(line)
        if match is None:
            await _stop_process(proc)
            err = (directory / "execd.stderr").read_bytes()[-2000:].decode(errors="replace")
            raise ExecdStartError(f"first line {line!r}; stderr: {err}")
        assert proc.stdout is not None  # started with stdout=PIPE
        drain = asyncio.get_running_loop().create_task(_drain(proc.stdout))
        port = int(match.group(2))
        self._running[key] = _Running(proc, directory, port, drain)
        self.started_total += 1
        return port

    async def _first_line(self, proc: asyncio.subprocess.Process) -> bytes:
        assert proc.stdout is not None
        try:
            return await asyncio.wait_for(proc.stdout.readline(), self.startup_timeout_s)
        except TimeoutError:
            return b""

    async def stop(self, key: str) -> None:
        running = self._running.get(key)
        if running is None:
            return
        # Forget it only once it is reaped: a cancelled stop leaves it for stop_all.
        await _stop_process(running.proc)
        self._running.pop(key, None)
        running.drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running.drain
        shutil.rmtree(running.directory, ignore_errors=True)

    async def stop_all(self) -> None:
        booting = [_stop_process(proc) for proc in list(self._booting.values())]
        await asyncio.gather(*booting, *(self.stop(key) for key in list(self._running)))
        if self._owns_base and self._base is not None:
            shutil.rmtree(self._base, ignore_errors=True)
            self._base = None


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def _stop_process(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
    await proc.wait()
