"""The container runtime of the stand-in's ``--run-execd`` mode: real processes per pod.

A pod's containers are run the way its spec says (``standin/containers.py``): its volumes
materialised in a directory of the pod's own, each init container run to completion in
order (a non-zero exit fails the pod, as ``Init:Error``), then the main container's
command started with its env (downward API, ``$(VAR)`` expansion). Nothing is taken from
annotations or from knowledge of what the pod runs: an execd the spec binds to 127.0.0.1
is not reachable at the pod's IP, so its readiness probe fails, as on a kubelet. A
container without a command (the image's entrypoint) is not run.

``python3`` on the container's PATH is the runtime's interpreter (``python``), through a
symlink in a directory of the runner's own; the stand-in's images hold what
:meth:`ExecdRunner.images` says (the carrier image: execd's package at ``/carrier/execd``; every
image: an empty ``/workspace``).

Invariants (MACHINE-NOTES: orphans become zombies here): every container process is a
direct child, stopped with SIGTERM then SIGKILL and always ``wait()``ed; ``stop_all`` runs
on server shutdown; stdout is drained continuously so a chatty process never blocks on a
full pipe. A process is tracked from the moment it is spawned, so a start that is
cancelled or a ``stop_all`` that comes while it runs still reaps it. ``on_exit`` is called
(on the loop) when a main container exits by itself, never for one :meth:`stop` ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from standin.containers import (
    ContainerConfigError,
    ImageModel,
    Launch,
    container_launch,
    default_path_env,
    materialise_volumes,
)

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
# The carrier image's contents (k8s/carrier/Dockerfile: execd's sources at /carrier/execd)
# and the empty WORKDIR every task image the stand-in runs has.
CARRIER_IMAGE_MARK = "execd-carrier"
WORKSPACE = "/workspace"


class ExecdStartError(RuntimeError):
    """A container could not be started, or an init container failed."""


@dataclass
class _Running:
    proc: asyncio.subprocess.Process
    directory: Path
    drain: asyncio.Task[None]
    watch: asyncio.Task[None] | None = None
    stopping: bool = False


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
        self.on_exit: Callable[[str, int], None] | None = None

    def _base_dir(self) -> Path:
        if self._base is None:
            self._base = Path(tempfile.mkdtemp(prefix="standin-execd-"))
            self._base.chmod(0o755)
            bin_dir = self._base / "bin"
            bin_dir.mkdir()
            (bin_dir / "python3").symlink_to(self.python)
            carrier = self._base / "carrier"
            carrier.mkdir()
            (carrier / "execd").symlink_to(Path(self.pythonpath) / "execd")
        return self._base

    def images(self) -> ImageModel:
        base = self._base_dir()
        return ImageModel(
            {"*": {WORKSPACE: None}, CARRIER_IMAGE_MARK: {"/carrier": base / "carrier"}}
        )

    def running(self) -> dict[str, int]:
        """key -> pid of every main container process still running."""
        return {key: r.proc.pid for key, r in self._running.items()}

    async def start(
        self, key: str, pod: Mapping[str, Any], secrets: Callable[[str], Mapping[str, str] | None]
    ) -> bool:
        """Run the pod's init containers, then start its main container (``sandbox``, else
        the first). Returns False when the main container has no command to run."""
        base = self._base_dir()
        directory = base / key
        directory.mkdir(parents=True, exist_ok=True)
        spec = pod.get("spec") or {}
        containers = spec.get("containers") or [{}]
        main = next((c for c in containers if c.get("name") == "sandbox"), containers[0])
        try:
            volumes = materialise_volumes(pod, directory, secrets)
            images, path_env = self.images(), default_path_env(base / "bin")

            def launch_of(container: Mapping[str, Any]) -> Launch | None:
                return container_launch(
                    pod,
                    container,
                    volumes=volumes,
                    images=images,
                    directory=directory,
                    base_env=path_env,
                    secrets=secrets,
                )

            inits = [launch_of(c) for c in spec.get("initContainers") or []]
            launch = launch_of(main)
        except (ContainerConfigError, OSError, ValueError) as exc:
            raise ExecdStartError(f"CreateContainerConfigError: {exc}") from exc
        for init in inits:
            if init is not None:
                await self._run_to_completion(key, init, directory)
        if launch is None:
            return False
        proc = await self._spawn(launch, directory)
        assert proc.stdout is not None  # started with stdout=PIPE
        drain = asyncio.get_running_loop().create_task(_drain(proc.stdout))
        running = _Running(proc, directory, drain)
        self._running[key] = running
        running.watch = asyncio.get_running_loop().create_task(self._watch(key, running))
        self.started_total += 1
        return True

    async def _spawn(self, launch: Launch, directory: Path) -> asyncio.subprocess.Process:
        try:
            stderr = open(directory / f"{launch.name}.stderr", "ab")  # noqa: SIM115 - closed below
        except OSError as exc:  # the pod was stopped (its directory removed) while starting
            raise ExecdStartError(f"StartError: {launch.name}: {exc}") from exc
        try:
            return await asyncio.create_subprocess_exec(
                *launch.argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                stdin=asyncio.subprocess.DEVNULL,
                cwd=str(launch.cwd),
                env=launch.env,
            )
        except OSError as exc:
            raise ExecdStartError(f"StartError: {launch.argv[0]}: {exc}") from exc
        finally:
            stderr.close()

    async def _run_to_completion(self, key: str, launch: Launch, directory: Path) -> None:
        proc = await self._spawn(launch, directory)
        self._booting[key] = proc
        try:
            assert proc.stdout is not None
            await asyncio.wait_for(
                asyncio.gather(_drain(proc.stdout), proc.wait()), self.startup_timeout_s
            )
        except TimeoutError:
            await _stop_process(proc)
            raise ExecdStartError(f"Init:Error: {launch.name} did not finish") from None
        except BaseException:  # cancelled (cluster stopping): reap it, then re-raise
            await _stop_process(proc)
            raise
        finally:
            self._booting.pop(key, None)
        if proc.returncode != 0:
            path = directory / f"{launch.name}.stderr"
            err = path.read_bytes()[-2000:] if path.exists() else b"(the pod was stopped)"
            raise ExecdStartError(
                f"Init:Error: {launch.name} exited with code {proc.returncode}: "
                + err.decode(errors="replace")
            )

    async def _watch(self, key: str, running: _Running) -> None:
        code = await running.proc.wait()
        if not running.stopping and self.on_exit is not None:
            self.on_exit(key, code)

    def stderr_of(self, key: str, container: str = "sandbox") -> str:
        path = self._base_dir() / key / f"{container}.stderr"
        return path.read_text(errors="replace") if path.exists() else ""

    async def stop(self, key: str) -> None:
        """Stop the pod's container (SIGTERM, then SIGKILL) and remove the pod's directory."""
        running = self._running.get(key)
        if running is not None:
            # Forget it only once it is reaped: a cancelled stop leaves it for stop_all.
            running.stopping = True
            await _stop_process(running.proc)
            self._running.pop(key, None)
            for task in (running.drain, running.watch):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
        if self._base is not None:
            shutil.rmtree(self._base / key, ignore_errors=True)

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
