"""``destroy`` for the local backend: kill the whole tree, reap, remove cgroup and files.

Order (each step idempotent, so a retried destroy resumes where a failed one stopped):
1. Stop the first process (then reap slirp4netns, which exits with the sandbox).
   Isolated: SIGKILL bubblewrap's child, PID 1 of the sandbox's
   PID namespace; the kernel kills the rest of the namespace and bubblewrap, having
   reaped its child, exits (SIGKILL for bubblewrap only if it does not). Plain: SIGTERM
   the init, which SIGKILLs and reaps every descendant (it is their subreaper), then
   SIGKILL it if it outlives the grace period.
2. Reap it (we are its parent; PID 1 here does not reap).
3. Kill whatever is still in the cgroup, then remove the cgroup. Without a cgroup, kill
   processes still carrying the sandbox's environment marker (``host_id``).
4. Remove the workspace and private files, then the record, then the directory.
``ProviderError`` is raised if the tree does not die in time; the caller retries.

:class:`Teardown` receives what it uses from the provider in its constructor (the root,
the per-name locks, the table of sandboxes this process spawned, the host's runtime, the
clock); it never sees the provider itself.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
import signal
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

from sandboxes.providers.base import Handle
from sandboxes.providers.local import cgroups, procs, records, usernet
from sandboxes.providers.local.locks import NameLocks
from sandboxes.providers.local.runtime import Runtime
from sandboxes.providers.local.spawn import Live
from sandman_site.errors import ProviderConflict, ProviderError

_EXIT_DEADLINE_S = 10.0
_POLL_S = 0.005


class Teardown:
    """``destroy`` of the local backend, and the undo of a create that failed half-way.

    ``live`` is the provider's table of sandboxes this process spawned (shared: a torn
    down sandbox leaves it here); ``host_id(name)`` names its cgroup and process marker.
    """

    def __init__(
        self,
        *,
        root: Path,
        locks: NameLocks,
        live: dict[str, Live],
        runtime: Callable[[], Awaitable[Runtime]],
        host_id: Callable[[str], str],
        monotonic: Callable[[], float],
        kill_grace_s: float,
    ) -> None:
        self._root, self._locks, self._live = root, locks, live
        self._runtime, self._host_id = runtime, host_id
        self._monotonic, self._kill_grace_s = monotonic, kill_grace_s

    async def destroy(self, handle: Handle) -> None:
        name = records.check_name(handle.name)
        directory = self._root / name
        async with self._locks.hold(name):
            record = records.read(directory)
            if record and handle.nonce and record.nonce and handle.nonce != record.nonce:
                raise ProviderConflict(
                    f"Sandbox {name!r} carries another nonce; not destroying it.", {"name": name}
                )
            await self.tear_down(name, directory, record)

    async def tear_down(
        self, name: str, directory: Path, record: records.SandboxRecord | None
    ) -> None:
        """Every step of the module's order; the caller holds the name's lock."""
        runtime = await self._runtime()
        live = self._live.pop(name, None)
        if live is not None and live.ready_fd is not None:
            os.close(live.ready_fd)
            live.ready_fd = None
        await self._stop_first_process(record, live)
        if live is not None and live.usernet_exit is not None:
            os.close(live.usernet_exit)
            live.usernet_exit = None
        if live is not None and live.usernet is not None:  # exits with the sandbox; reap it
            await usernet.stop(live.usernet)
            live.usernet = None
        if runtime.cgroups is not None:
            group = self._host_id(name)
            try:
                await asyncio.to_thread(_kill_and_remove_cgroup, runtime.cgroups, group)
            except (OSError, cgroups.CgroupError) as exc:
                raise ProviderError(
                    f"cgroup of {name!r} could not be emptied: {exc}", {"name": name}
                ) from exc
        else:  # no cgroup to empty: whatever still carries the sandbox's marker
            await asyncio.to_thread(procs.kill_marked, self._host_id(name))
        try:
            await asyncio.to_thread(_remove_dir, directory)
        except OSError as exc:
            raise ProviderError(
                f"files of {name!r} could not be removed: {exc}", {"name": name}
            ) from exc

    async def _stop_first_process(
        self, record: records.SandboxRecord | None, live: Live | None
    ) -> None:
        pid = live.popen.pid if live is not None else (record.pid if record else None)
        if not pid:
            return
        started = record.pid_start if record and record.pid_start else procs.start_time(pid)
        isolated = record.isolated if record is not None else True
        if isolated:
            # Kill bubblewrap's sandbox child (PID 1 of the sandbox's namespace: the kernel
            # then kills the rest), not bubblewrap itself: bubblewrap reaps it and exits.
            # Killed first, bubblewrap would orphan that child to the host's PID 1 as a zombie.
            inner = procs.children(pid) if procs.is_ours(pid, started) else []
            for child in inner:
                procs.send(child, procs.start_time(child), signal.SIGKILL)
            if not inner or not await self._wait_gone(
                pid, started, live, _EXIT_DEADLINE_S / 2, strict=False
            ):
                procs.send(pid, started, signal.SIGKILL)
            await self._wait_gone(pid, started, live, _EXIT_DEADLINE_S)
            return
        if procs.send(pid, started, signal.SIGTERM):
            if await self._wait_gone(pid, started, live, self._kill_grace_s, strict=False):
                return
            procs.send(pid, started, signal.SIGKILL)
        await self._wait_gone(pid, started, live, _EXIT_DEADLINE_S)

    async def _wait_gone(
        self,
        pid: int,
        started: int | None,
        live: Live | None,
        deadline_s: float,
        strict: bool = True,
    ) -> bool:
        """Poll until the process has exited and been reaped; False (or raise) at deadline."""
        end = self._monotonic() + deadline_s
        while True:
            if live is not None:
                if live.popen.poll() is not None:
                    return True
            else:
                procs.reap(pid)
                if not procs.is_ours(pid, started):
                    return True
            if self._monotonic() >= end:
                if strict:
                    raise ProviderError(f"process {pid} did not exit within {deadline_s:g} s")
                return False
            await asyncio.sleep(_POLL_S)


def _kill_and_remove_cgroup(driver: cgroups.CgroupDriver, group: str) -> None:
    driver.kill(group)
    driver.remove(group)


def _make_writable(function: Callable[[str], object], path: str, exc_info: object) -> None:
    """rmtree helper for a provider that is not root: a sandbox may chmod its files."""
    error = exc_info[1] if isinstance(exc_info, tuple) else exc_info
    if not isinstance(error, PermissionError):
        raise error  # type: ignore[misc]
    target = path if function in (os.scandir, os.open) else os.path.dirname(path)
    os.chmod(target, os.stat(target).st_mode | stat.S_IRWXU)
    function(path)


def _remove_dir(directory: Path) -> None:
    if not directory.exists():
        return
    for entry in directory.iterdir():
        if entry.name == records.META:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, onerror=_make_writable)
        else:
            entry.unlink(missing_ok=True)
    (directory / records.META).unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise
