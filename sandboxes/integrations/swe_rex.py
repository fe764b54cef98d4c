"""A SWE-ReX deployment and runtime backed by a Sandman sandbox.

    deployment = SandmanDeployment(base_url="http://sandman:8000", token=..., image=...)
    await deployment.start()
    await deployment.runtime.create_session(CreateBashSessionRequest())
    obs = await deployment.runtime.run_in_session(BashAction(command="ls", check="silent"))

The runtime keeps SWE-ReX's contract: every SWE-ReX session is an execd session (its
``default`` is execd's default shell, any other name a named shell created with
``POST /sessions``, its ``startup_source`` files sourced as that session's startup
script, so they are sourced again if its shell ever restarts); ``run_in_session`` runs in
the session's persistent shell (state carries over, as in SWE-ReX's pexpect session) and
raises ``CommandTimeoutError``, ``BashIncorrectSyntaxError`` and (``check="raise"``)
``NonZeroExitCodeError`` as ``LocalRuntime`` does; ``BashInterruptAction`` sends SIGINT
to that session's running foreground job only (execd's ``/sessions/{name}/interrupt``:
the interrupted command answers exit 130, the session keeps its state); ``execute`` runs
one command apart from any session (``isolate``), with its ``cwd`` and ``env``, and
returns stdout and stderr apart; files go through execd's byte-exact file routes.
Differences, on purpose: ``run_in_session``'s output is stdout and stderr in one stream,
as a terminal shows them; closing the ``default`` session forgets it (execd's default
shell stays).

Invariant: every blocking client call runs in a worker thread (``asyncio.to_thread``),
never on the caller's event loop; ``stop()`` releases the sandbox once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swerex.deployment.abstract import AbstractDeployment
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook
from swerex.exceptions import (
    BashIncorrectSyntaxError,
    CommandTimeoutError,
    DeploymentNotStartedError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
)
from swerex.runtime.abstract import (
    AbstractRuntime,
    BashInterruptAction,
    BashObservation,
    CloseBashSessionResponse,
    CloseResponse,
    Command,
    CommandResponse,
    CreateBashSessionResponse,
    IsAliveResponse,
    ReadFileResponse,
    UploadResponse,
    WriteFileResponse,
)

from sandboxes.client import Client, Sandbox, SandmanClientError

log = logging.getLogger(__name__)

NO_TIMEOUT_S = 7 * 86_400.0  # SWE-ReX's "no timeout": execd's longest
DEFAULT_SESSION = "default"  # SWE-ReX's default session name, and execd's default shell


class SandmanRuntime(AbstractRuntime):
    """SWE-ReX's runtime API over one acquired sandbox."""

    def __init__(self, sandbox: Sandbox) -> None:
        super().__init__()
        self.sandbox = sandbox
        self._sessions: set[str] = set()

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        try:
            health = await asyncio.to_thread(self.sandbox.health)
        except SandmanClientError as exc:
            return IsAliveResponse(is_alive=False, message=str(exc))
        return IsAliveResponse(is_alive=bool(health.get("shell_alive")))

    async def create_session(self, request: Any) -> CreateBashSessionResponse:
        name = request.session
        if name in self._sessions:
            raise SessionExistsError(f"session {name} already exists")
        sources = "\n".join(f"source {shlex.quote(p)}" for p in request.startup_source)
        if name == DEFAULT_SESSION:  # execd's default shell exists: source them there
            output = ""
            if sources:
                output = (await self._run(sources, request.startup_timeout, name)).output
        else:
            try:
                made = await asyncio.to_thread(
                    self.sandbox.create_session,
                    name,
                    startup=sources or None,
                    startup_timeout_s=request.startup_timeout or None,
                )
            except SandmanClientError as exc:
                if exc.code == "session_exists":
                    raise SessionExistsError(f"session {name} already exists") from exc
                raise
            output = made.startup.output if made.startup is not None else ""
        self._sessions.add(name)
        return CreateBashSessionResponse(output=output)

    async def run_in_session(self, action: Any) -> BashObservation:
        if action.session not in self._sessions:
            raise SessionDoesNotExistError(f"session {action.session!r} does not exist")
        if isinstance(action, BashInterruptAction):
            await asyncio.to_thread(self.sandbox.interrupt, action.session)
            return BashObservation(output="", exit_code=0)
        ran = await self._run(action.command, action.timeout, action.session)
        if ran.timed_out:
            raise CommandTimeoutError(
                f"timeout after {action.timeout} seconds while running command {action.command!r}"
            )
        if ran.error_code == "syntax_error":
            raise BashIncorrectSyntaxError(
                f"Error ({ran.exit_code}) while checking bash command \n{action.command!r}\n"
                f"---- Stderr ----\n{ran.output}\n---- Stdout ----\n",
                extra_info={"bash_stdout": "", "bash_stderr": ran.output},
            )
        exit_code = None if action.check == "ignore" else ran.exit_code
        if action.check == "raise" and ran.exit_code != 0:
            msg = (
                f"Command {action.command!r} failed with exit code {ran.exit_code}. "
                f"Here is the output:\n{ran.output!r}"
            )
            raise NonZeroExitCodeError(f"{action.error_msg}: {msg}" if action.error_msg else msg)
        return BashObservation(output=ran.output, exit_code=exit_code)

    async def close_session(self, request: Any) -> CloseBashSessionResponse:
        if request.session not in self._sessions:
            raise SessionDoesNotExistError(f"session {request.session!r} does not exist")
        self._sessions.discard(request.session)
        if request.session != DEFAULT_SESSION:
            await asyncio.to_thread(self.sandbox.delete_session, request.session)
        return CloseBashSessionResponse()

    async def execute(self, command: Command) -> CommandResponse:
        text = command.command if isinstance(command.command, str) else shlex.join(command.command)
        if not command.shell and isinstance(command.command, str):
            text = shlex.quote(command.command)  # a program name, as subprocess would take it
        if command.env is not None:  # subprocess's env= replaces the environment: env -i
            assigns = "".join(f"{k}={shlex.quote(v)} " for k, v in command.env.items())
            shell = f"bash -c {shlex.quote(text)}" if command.shell else text
            text = f"env -i {assigns}{shell}"
        ran = await asyncio.to_thread(
            self.sandbox.run,
            text,
            timeout_s=command.timeout or NO_TIMEOUT_S,
            cwd=command.cwd,
            isolate=True,
            stderr="separate",
        )
        if ran.timed_out:
            raise CommandTimeoutError(
                f"Timeout ({command.timeout}s) exceeded while running command"
            )
        stderr = ran.stderr or ""
        response = CommandResponse(stdout=ran.output, stderr=stderr, exit_code=ran.exit_code)
        if command.check and ran.exit_code != 0:
            msg = (
                f"Command {command.command!r} failed with exit code {ran.exit_code}. "
                f"Stdout:\n{ran.output!r}\nStderr:\n{stderr!r}"
            )
            raise NonZeroExitCodeError(f"{command.error_msg}: {msg}" if command.error_msg else msg)
        return response

    async def read_file(self, request: Any) -> ReadFileResponse:
        got = await asyncio.to_thread(self.sandbox.read_bytes, request.path)
        return ReadFileResponse(
            content=got.data.decode(request.encoding or "utf-8", request.errors or "strict")
        )

    async def write_file(self, request: Any) -> WriteFileResponse:
        await asyncio.to_thread(
            self.sandbox.write, request.path, request.content, make_parents=True
        )
        return WriteFileResponse()

    async def upload(self, request: Any) -> UploadResponse:
        """A file, or a directory tree, from this machine into the sandbox."""
        source = Path(request.source_path)
        files = (
            [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
        )
        for path in files:
            rel = path.relative_to(source) if path != source else Path()
            target = os.path.join(request.target_path, str(rel)) if str(rel) != "." else None
            mode = path.stat().st_mode & 0o7777
            await asyncio.to_thread(
                self.sandbox.write,
                target or request.target_path,
                path.read_bytes(),
                mode=mode,
                make_parents=True,
            )
        return UploadResponse()

    async def close(self) -> CloseResponse:
        for name in sorted(self._sessions - {DEFAULT_SESSION}):
            await asyncio.to_thread(self.sandbox.delete_session, name)
        self._sessions.clear()
        return CloseResponse()

    async def _run(self, command: str, timeout: float | None, session: str) -> Any:
        return await asyncio.to_thread(
            self.sandbox.run,
            command,
            timeout_s=timeout or NO_TIMEOUT_S,
            session=None if session == DEFAULT_SESSION else session,
        )


@dataclass(frozen=True)
class SandmanDeploymentConfig:
    base_url: str = ""  # $SANDMAN_URL when empty
    token: str = ""  # $SANDMAN_TOKEN when empty
    job_id: int | None = None  # None: register a job named job_name
    job_name: str = "swe-rex"
    image: str = "sandman/empty"
    spec: dict[str, str] = field(default_factory=lambda: {"cpu": "1", "memory": "1Gi"})
    base_commit: str | None = None
    acquire_timeout_s: float = 300.0


class SandmanDeployment(AbstractDeployment):
    """Acquires a sandbox on ``start()`` (or wraps ``sandbox``) and releases it on
    ``stop()``; keyword arguments are ``SandmanDeploymentConfig``'s fields."""

    def __init__(self, *, sandbox: Sandbox | None = None, **kwargs: Any) -> None:
        self.logger = log
        self._hooks = CombinedDeploymentHook()
        self.config = SandmanDeploymentConfig(**kwargs)
        self._given = sandbox
        self._client: Client | None = None
        self._runtime: SandmanRuntime | None = None

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        return await self.runtime.is_alive(timeout=timeout)

    async def start(self, *args: Any, **kwargs: Any) -> None:
        sandbox = self._given if self._given is not None else await asyncio.to_thread(self._acquire)
        self._runtime = SandmanRuntime(sandbox)

    def _acquire(self) -> Sandbox:
        c = self.config
        self._client = Client(
            c.base_url or os.environ["SANDMAN_URL"], c.token or os.environ["SANDMAN_TOKEN"]
        )
        job = (
            self._client.get_job(c.job_id)
            if c.job_id is not None
            else self._client.job(name=c.job_name)
        )
        return job.acquire(
            image=c.image,
            spec=dict(c.spec),
            base_commit=c.base_commit,
            timeout_s=c.acquire_timeout_s,
        )

    async def stop(self, *args: Any, **kwargs: Any) -> None:
        runtime, self._runtime = self._runtime, None
        if runtime is not None and self._client is not None:
            await asyncio.to_thread(runtime.sandbox.release)
            self._client.close()
            self._client = None

    @property
    def runtime(self) -> SandmanRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime
