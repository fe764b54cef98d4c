"""Helpers for the local provider's tests: specs, execd calls over HTTP, git templates."""

from __future__ import annotations

import asyncio
import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from sandboxes.providers.base import Handle, SandboxSpec
from sandboxes.providers.local import LocalProvider
from sandboxes.tests.http_support import post_json


def make_spec(name: str, **overrides: object) -> SandboxSpec:
    values: dict[str, object] = dict(
        name=name,
        nonce=f"nonce-{name}",
        token=f"token-{name}-s3cr3t",
        job_id=7,
        role="rollout",
        image="sandman/empty",
        base_commit=None,
        cpu_millis=1000,
        memory_bytes=512 * 2**20,
        workspace_bytes=None,
        egress="allow",
        key_hash="key",
    )
    values.update(overrides)
    return SandboxSpec(**values)  # type: ignore[arg-type]


def _post(address: str, path: str, token: str, body: dict[str, object]) -> dict[str, object]:
    try:
        return post_json(
            f"http://{address}{path}", body, headers={"Authorization": f"Bearer {token}"}
        )
    except urllib.error.HTTPError as error:
        return {"http_status": error.code, **json.loads(error.read() or b"{}")}


async def run_in(address: str, token: str, command: str, timeout_s: float = 30) -> dict:
    """Run ``command`` in the sandbox's persistent bash through execd's ``POST /exec``."""
    return await asyncio.to_thread(
        _post, address, "/exec", token, {"command": command, "timeout_s": timeout_s}
    )


def _get(address: str, path: str, token: str) -> dict[str, object]:
    request = urllib.request.Request(
        f"http://{address}{path}", headers={"Authorization": f"Bearer {token}"}
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


async def probe(address: str, token: str) -> dict:
    """execd's ``GET /probe`` readings (what a grader would read inside the sandbox)."""
    answer = await asyncio.to_thread(_get, address, "/probe", token)
    return answer["readings"]  # type: ignore[return-value]


def git(cwd: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


async def destroy_all(provider: LocalProvider) -> None:
    for owned in await provider.list_owned():
        await provider.destroy(Handle(name=owned.name, nonce="", backend="local"))
