"""A mini-swe-agent environment backed by a Sandman sandbox.

Select it by dotted path in a mini-swe-agent YAML config::

    environment:
      environment_class: sandboxes.integrations.mini_swe_agent.SandmanEnvironment
      base_url: http://sandman:8000      # or $SANDMAN_URL
      image: sandman/empty

Each action runs in the sandbox's persistent shell with ``isolate`` (a subshell): it sees
the shell's state but its ``cd``, ``export``, ``exit N`` or ``set -e`` end with it, as with
mini-swe-agent's own ``LocalEnvironment`` (a fresh ``subprocess`` per action), and
background servers it started keep running. The answer dict has the shape
``LocalEnvironment.execute`` returns; a timeout is ``returncode -1`` with the same
``exception_info`` sentence. Invariant: the sandbox is acquired once, in the constructor,
and released by ``close()`` (idempotent).
"""

from __future__ import annotations

import os
import shlex
import uuid
from typing import Any

from minisweagent.exceptions import Submitted
from minisweagent.utils.serialize import recursive_merge
from pydantic import BaseModel

from sandboxes.client import Client, Sandbox

SUBMIT_MARKER = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class SandmanEnvironmentConfig(BaseModel):
    base_url: str = ""
    """Sandman's URL ($SANDMAN_URL when empty)."""
    token: str = ""
    """A trainer token ($SANDMAN_TOKEN when empty); never serialized."""
    job_id: int | None = None
    """An existing job to acquire from; None registers one named ``job_name``."""
    job_name: str = "mini-swe-agent"
    image: str = "sandman/empty"
    base_commit: str | None = None
    spec: dict[str, str] = {"cpu": "1", "memory": "1Gi"}
    acquire_timeout_s: float = 300.0
    cwd: str = ""
    """Directory actions run in (the sandbox's workspace when empty)."""
    env: dict[str, str] = {}
    """Exported once in the sandbox's shell before the first action. With ``BASH_ENV``
    (mini-swe-agent's SWE-bench config ``conda activate``s through it) the actions run in
    an execd session whose startup script exports these and sources ``$BASH_ENV``, as
    every ``bash -c`` of ``LocalEnvironment`` does."""
    timeout: int = 30
    max_output_bytes: int | None = None


class SandmanEnvironment:
    def __init__(
        self,
        *,
        config_class: type = SandmanEnvironmentConfig,
        sandbox: Sandbox | None = None,
        **kwargs: Any,
    ) -> None:
        """Acquire a sandbox (or use ``sandbox``, already acquired) for this agent run."""
        self.config = config_class(**kwargs)
        self._client: Client | None = None
        if sandbox is None:
            url = self.config.base_url or os.environ["SANDMAN_URL"]
            self._client = Client(url, self.config.token or os.environ["SANDMAN_TOKEN"])
            job = (
                self._client.get_job(self.config.job_id)
                if self.config.job_id is not None
                else self._client.job(name=self.config.job_name)
            )
            sandbox = job.acquire(
                image=self.config.image,
                spec=dict(self.config.spec),
                base_commit=self.config.base_commit,
                timeout_s=self.config.acquire_timeout_s,
            )
        self.sandbox = sandbox
        self._session: str | None = None
        env = dict(self.config.env)
        if env.get("BASH_ENV"):
            exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
            self._session = self.sandbox.create_session(
                f"mini-swe-agent-{uuid.uuid4().hex[:12]}",
                startup=exports + '[ -f "$BASH_ENV" ] && source "$BASH_ENV"\n',
            ).name
        elif env:
            self.sandbox.set_env(env)

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        """Run ``action["command"]``; the dict ``LocalEnvironment.execute`` would return."""
        command = action.get("command", "")
        limit = timeout or self.config.timeout
        result = self.sandbox.run(
            command,
            timeout_s=float(limit),
            cwd=cwd or self.config.cwd or None,
            isolate=True,
            max_output_bytes=self.config.max_output_bytes,
            session=self._session,
        )
        output: dict[str, Any] = {
            "output": result.output,
            "returncode": result.exit_code,
            "exception_info": "",
        }
        if result.timed_out:
            sentence = f"Command '{command}' timed out after {limit} seconds"
            output.update(
                returncode=-1,
                exception_info=f"An error occurred while executing the command: {sentence}",
                extra={"exception_type": "TimeoutExpired", "exception": sentence},
            )
        self._check_finished(output)
        return output

    def _check_finished(self, output: dict[str, Any]) -> None:
        """Raises Submitted when the output starts with the submit marker (as upstream)."""
        lines = output.get("output", "").lstrip().splitlines(keepends=True)
        if lines and lines[0].strip() == SUBMIT_MARKER and output["returncode"] == 0:
            submission = "".join(lines[1:])
            raise Submitted(
                {
                    "role": "exit",
                    "content": submission,
                    "extra": {"exit_status": "Submitted", "submission": submission},
                }
            )

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        """The config without its token (not the host's environment: the sandbox is elsewhere)."""
        return recursive_merge(self.config.model_dump(exclude={"token"}), kwargs)

    def serialize(self) -> dict[str, Any]:
        return {
            "info": {
                "config": {
                    "environment": self.config.model_dump(mode="json", exclude={"token"}),
                    "environment_type": f"{self.__class__.__module__}.{self.__class__.__name__}",
                    "sandbox_id": self.sandbox.sandbox_id,
                }
            }
        }

    def close(self) -> None:
        """Release the sandbox (only one this environment acquired)."""
        if self._session is not None and self._client is None:  # a sandbox we were given
            self.sandbox.delete_session(self._session)
        self._session = None
        if self._client is not None:
            self.sandbox.release()
            self._client.close()
            self._client = None
