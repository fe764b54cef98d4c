"""``wait_ready`` for the local backend: the ready line, one good health answer, guards.

:class:`ReadinessWaiter` receives what it uses from the provider in its constructor (the
root, the table of sandboxes this process spawned, the health check, the host's runtime,
the clocks); it never sees the provider itself.

Invariants:
* A sandbox is Ready only after execd said ``listening on`` (read from its ready pipe by
  ``read_line``, not HTTP) AND answered ``/health`` with ``ok: true`` at the address we
  hand out.
* On any failure (budget spent, execd died first) ``SandboxNotReady`` is raised and the
  sandbox is left as it is, for the caller's ``destroy``; the error carries the tail of
  execd's log so the reason is not lost with the sandbox.
* The CPU limit deferred at create is written before Ready (and before the guards are
  read); a sandbox whose limit cannot be written is not Ready.
* The guards in ``ReadyInfo`` are read from the running sandbox's first process in /proc
  (its namespaces against ours, its host uid, its capabilities); an egress-denied sandbox
  whose network namespace cannot be confirmed is not Ready, and an isolated egress-allowed
  one is not Ready before slirp4netns has configured its network (``usernet.py``).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

from sandboxes.providers.base import Handle, ReadyInfo
from sandboxes.providers.local import isolation, procs, records, usernet
from sandboxes.providers.local.runtime import Runtime
from sandboxes.providers.local.spawn import Live
from sandman_site.errors import SandboxNotReady

_HEALTH_RETRY_S = 0.01
_LOCAL_HOSTS = ("", "0.0.0.0", "127.0.0.1", "localhost", "::", "::1")


async def read_line(fd: int, timeout_s: float) -> bytes:
    """The first line written to the non-blocking pipe ``fd`` (b"" if it closed first).

    Uses no thread (a burst of creates waiting for readiness never queues behind the
    default executor's few workers). Raises ``TimeoutError`` when no full line (nor EOF)
    arrives in time.
    """
    loop = asyncio.get_running_loop()
    buffer = bytearray()
    finished: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        buffer.extend(chunk)
        if (not chunk or b"\n" in buffer) and not finished.done():
            finished.set_result(None)

    loop.add_reader(fd, readable)
    try:
        await asyncio.wait_for(finished, max(timeout_s, 0.0))
    finally:
        loop.remove_reader(fd)
    return bytes(buffer).split(b"\n", 1)[0]


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


class ReadinessWaiter:
    """``wait_ready`` of the local backend.

    ``live`` is the provider's table of sandboxes this process spawned (shared, not
    copied: their ready pipes are read and closed here); ``health(handle, address,
    token)`` is the provider's health check; ``host_id(name)`` names the sandbox's cgroup.
    """

    def __init__(
        self,
        *,
        root: Path,
        live: dict[str, Live],
        health: Callable[[Handle, str, str], Awaitable[bool]],
        runtime: Callable[[], Awaitable[Runtime]],
        host_id: Callable[[str], str],
        clock: Callable[[], dt.datetime],
        monotonic: Callable[[], float],
    ) -> None:
        self._root, self._live = root, live
        self._health, self._runtime, self._host_id = health, runtime, host_id
        self._clock, self._monotonic = clock, monotonic

    async def _apply_cpu_limit(
        self, record: records.SandboxRecord, directory: os.PathLike[str]
    ) -> dict[str, object]:
        """Write the deferred CPU limit (provider.py); what the kernel reports goes in guards."""
        runtime = await self._runtime()
        millis = record.cpu_millis_pending
        assert millis
        try:
            if runtime.cgroups is None:
                raise OSError("no cgroup driver")
            applied = runtime.cgroups.set_cpu(self._host_id(record.name), millis)
        except OSError as exc:
            raise _not_ready(
                record.name, f"its CPU limit could not be set: {exc}", directory
            ) from exc
        record.cpu_millis_pending = None
        return applied

    async def wait_ready(self, handle: Handle, budget_s: float) -> ReadyInfo:
        deadline = self._monotonic() + budget_s
        name = records.check_name(handle.name)
        directory = self._root / name
        record = records.read(directory)
        if record is None:
            raise SandboxNotReady(f"Sandbox {name!r} does not exist here.", {"name": name})
        live = self._live.get(name)
        timeline = (
            dict(live.timeline)
            if live
            else {k: dt.datetime.fromisoformat(v) for k, v in record.timeline.items()}
        )
        address = record.address
        if live is not None and live.ready_fd is not None:
            try:
                line = await read_line(live.ready_fd, deadline - self._monotonic())
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
            timeline["address_assigned"] = self._clock()
            record.address = address
            records.write(directory, record)
            if live.usernet_exit is not None:
                await self._attach_usernet(record, live, directory, deadline)
        if not address:
            raise _not_ready(name, "no address is known (started by another process?)", directory)
        while not await self._health(handle, address, ""):
            if self._monotonic() >= deadline:
                raise _not_ready(
                    name, f"execd at {address} did not answer health in time", directory
                )
            await asyncio.sleep(_HEALTH_RETRY_S)
        guards = dict(record.guards)
        if record.cpu_millis_pending:
            guards.update(await self._apply_cpu_limit(record, directory))
        timeline["ready"] = self._clock()
        return self._confirmed(name, directory, record, address, guards, timeline)

    async def _attach_usernet(
        self, record: records.SandboxRecord, live: Live, directory: Path, deadline: float
    ) -> None:
        """slirp4netns on the sandbox's network namespace (execd listens: bwrap is done)."""
        exit_fd, live.usernet_exit = live.usernet_exit, None
        assert exit_fd is not None
        slirp = (await self._runtime()).usernet
        init = _first_sandbox_process(record)
        if slirp is None or init is None:
            os.close(exit_fd)
            why = "slirp4netns is missing" if slirp is None else "its processes are gone"
            raise _not_ready(record.name, f"its network cannot be attached: {why}", directory)
        log_path = str(directory / "private" / "usernet.log")
        try:
            live.usernet = await usernet.attach(
                slirp, init, exit_fd, log_path, deadline - self._monotonic()
            )
        except OSError as exc:
            raise _not_ready(record.name, str(exc), directory) from exc

    def _confirmed(
        self,
        name: str,
        directory: Path,
        record: records.SandboxRecord,
        address: str,
        guards: dict[str, object],
        timeline: dict[str, dt.datetime],
    ) -> ReadyInfo:
        """Read the guards from the running sandbox, record them, and answer Ready."""
        init = _first_sandbox_process(record)
        if init is None:
            raise _not_ready(name, "its processes are gone", directory)
        measured = isolation.measure_guards(init)
        if "host_uid" not in measured:
            raise _not_ready(
                name, "its first process vanished while its guards were read", directory
            )
        guards.update(measured)
        guards["egress"] = "denied" if record.egress == "deny" else "allowed"
        if record.egress == "deny":
            guards["network"] = "none"
        else:  # isolated: the outside world through slirp4netns; plain: the host's own
            guards["network"] = "usernet" if measured.get("net_ns") else "host"
        if record.isolated and not measured.get("net_ns"):
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
