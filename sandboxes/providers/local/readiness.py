"""``wait_ready`` for the local backend: the ready line, one good health answer, guards.

Invariants:
* A sandbox is Ready only after execd said ``listening on`` AND answered ``/health``
  with ``ok: true`` at the address we hand out.
* On any failure (budget spent, execd died first) ``SandboxNotReady`` is raised and the
  sandbox is left as it is, for the caller's ``destroy``; the error carries the tail of
  execd's log so the reason is not lost with the sandbox.
* The CPU limit deferred at create is written before Ready (and before the guards are
  read); a sandbox whose limit cannot be written is not Ready.
* The guards in ``ReadyInfo`` are read from the running sandbox's first process in /proc
  (its namespaces against ours, its host uid, its capabilities); an egress-denied sandbox
  whose network namespace cannot be confirmed is not Ready.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import socket
from typing import TYPE_CHECKING

from sandboxes.providers.base import Handle, ReadyInfo
from sandboxes.providers.local import isolation, procs, records, wire
from sandman_site.errors import SandboxNotReady

if TYPE_CHECKING:
    from sandboxes.providers.local.provider import LocalProvider

_HEALTH_RETRY_S = 0.01
_LOCAL_HOSTS = ("", "0.0.0.0", "127.0.0.1", "localhost", "::", "::1")


def _log_tail(directory: os.PathLike[str] | str, limit: int = 2000) -> str:
    try:
        with open(os.path.join(directory, "private", "execd.log"), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - limit))
            return handle.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _address(line: bytes) -> str | None:
    text = line.decode("utf-8", "replace").strip()
    if not text.startswith("listening on "):
        return None
    host, _, port = text[len("listening on ") :].rpartition(":")
    if not port.isdigit():
        return None
    host = host.strip("[]")
    return f"127.0.0.1:{port}" if host in _LOCAL_HOSTS else f"{host}:{port}"


def _not_ready(name: str, why: str, directory: os.PathLike[str]) -> SandboxNotReady:
    tail = _log_tail(directory)
    detail = f"Sandbox {name!r} is not ready: {why}."
    if tail:
        detail += f" execd log: {tail[-500:]}"
    return SandboxNotReady(detail, {"name": name})


def _first_sandbox_process(record: records.SandboxRecord) -> int | None:
    """The sandbox's init: our child when plain; bwrap's grandchild when isolated."""
    if not record.pid:
        return None
    if not record.isolated:
        return record.pid
    for inner in procs.children(record.pid):  # bubblewrap's PID 1 of the namespace
        for init in procs.children(inner):
            return init
    return None


async def _apply_cpu_limit(
    provider: LocalProvider, record: records.SandboxRecord, directory: os.PathLike[str]
) -> dict[str, object]:
    """Write the deferred CPU limit (provider.py); what the kernel reports goes in guards."""
    runtime = await provider.runtime()
    millis = record.cpu_millis_pending
    assert millis
    try:
        if runtime.cgroups is None:
            raise OSError("no cgroup driver")
        applied = runtime.cgroups.set_cpu(provider.host_id(record.name), millis)
    except OSError as exc:
        raise _not_ready(record.name, f"its CPU limit could not be set: {exc}", directory) from exc
    record.cpu_millis_pending = None
    return applied


async def wait_ready(provider: LocalProvider, handle: Handle, budget_s: float) -> ReadyInfo:
    deadline = provider._monotonic() + budget_s
    name = records.check_name(handle.name)
    directory = provider.root / name
    record = records.read(directory)
    if record is None:
        raise SandboxNotReady(f"Sandbox {name!r} does not exist here.", {"name": name})
    live = provider._live.get(name)
    timeline = (
        dict(live.timeline)
        if live
        else {k: dt.datetime.fromisoformat(v) for k, v in record.timeline.items()}
    )
    address = record.address
    if live is not None and live.ready_fd is not None:
        try:
            line = await wire.read_line(live.ready_fd, deadline - provider._monotonic())
        except TimeoutError:
            raise _not_ready(
                name, f"execd did not listen within {budget_s:g} s", directory
            ) from None
        os.close(live.ready_fd)
        live.ready_fd = None
        address = _address(line) or ""
        if not address:
            why = line.decode("utf-8", "replace").strip() or "its first process exited"
            raise _not_ready(name, why, directory)
        timeline["address_assigned"] = provider._clock()
        record.address = address
        records.write(directory, record)
    if not address:
        raise _not_ready(name, "no address is known (started by another process?)", directory)
    while not await provider.health(handle, address, ""):
        if provider._monotonic() >= deadline:
            raise _not_ready(name, f"execd at {address} did not answer health in time", directory)
        await asyncio.sleep(_HEALTH_RETRY_S)
    guards = dict(record.guards)
    if record.cpu_millis_pending:
        guards.update(await _apply_cpu_limit(provider, record, directory))
    timeline["ready"] = provider._clock()
    init = _first_sandbox_process(record)
    if init is None:
        raise _not_ready(name, "its processes are gone", directory)
    measured = isolation.measure_guards(init)
    if "host_uid" not in measured:
        raise _not_ready(name, "its first process vanished while its guards were read", directory)
    guards.update(measured)
    guards["egress"] = "denied" if measured.get("net_ns") else "allowed"
    if record.egress == "deny" and not measured.get("net_ns"):
        raise _not_ready(name, "its network namespace could not be confirmed", directory)
    record.guards = guards
    record.timeline = {k: records.stamp(v) for k, v in timeline.items()}
    records.write(directory, record)
    return ReadyInfo(
        address=address,
        node=socket.gethostname(),
        guards=guards,
        timeline=timeline,
        image_present=True,
    )
