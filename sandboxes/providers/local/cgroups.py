"""Resource limits for local sandboxes through cgroups, v2 or v1, whichever the host has.

A sandbox's cgroup is ``<mount>/sandman/<name>`` (v2), or that path under each v1
hierarchy we use (memory, cpu, pids, freezer). The process is placed in it by writing
its pid to ``cgroup.procs`` BEFORE it forks (the provider's launch wrapper does it), so
everything the sandbox starts is inside.

Invariants:
* What :meth:`CgroupDriver.create` returns is read back from the kernel, never echoed
  from the request: the sandbox record reports only limits that are really set.
* :meth:`CgroupDriver.kill` leaves the cgroup empty or raises; ``remove`` only removes
  empty cgroups. Both are idempotent (a missing cgroup is already clean).
* Waits here poll a kernel file until a deadline; they never sleep a fixed time.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

PARENT = "sandman"
CPU_PERIOD_US = 100_000
_V1_CONTROLLERS = ("memory", "cpu", "pids", "freezer")


class CgroupError(Exception):
    """A cgroup could not be set up or emptied."""


@dataclass(frozen=True)
class Limits:
    memory_bytes: int | None
    cpu_millis: int | None
    pids_max: int | None


@dataclass(frozen=True)
class Placement:
    """Where a sandbox's cgroup lives and what the kernel says its limits are."""

    version: str  # "v1" | "v2"
    procs_files: tuple[str, ...]
    # Host directories to bind read-only at /sys/fs/cgroup[/<controller>] inside.
    views: tuple[tuple[str, str], ...]
    applied: dict[str, object] = field(default_factory=dict)


def _write(path: Path, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def _read(path: Path) -> str:
    with open(path) as handle:
        return handle.read().strip()


def _pids(directory: Path) -> list[int]:
    try:
        return [int(line) for line in _read(directory / "cgroup.procs").split()]
    except FileNotFoundError:
        return []


def _wait_until(predicate: Callable[[], bool], deadline_s: float, step_s: float = 0.005) -> bool:
    end = time.monotonic() + deadline_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(step_s)


def _cgroup_mounts() -> list[tuple[str, str, set[str]]]:
    """(mountpoint, fstype, options) for every cgroup mount this process sees."""
    mounts = []
    with open("/proc/self/mounts") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                mounts.append((parts[1], parts[2], set(parts[3].split(","))))
    return mounts


class CgroupDriver:
    version = ""

    def create(self, name: str, limits: Limits) -> Placement:  # pragma: no cover - abstract
        raise NotImplementedError

    def set_cpu(self, name: str, cpu_millis: int) -> dict[str, object]:  # pragma: no cover
        """Write a CPU limit to an existing cgroup; return what the kernel reports."""
        raise NotImplementedError

    def cpu_quota(self, name: str) -> float | None:  # pragma: no cover
        """The CPU limit in cores the kernel holds for the cgroup; None when unlimited."""
        raise NotImplementedError

    def kill(self, name: str, deadline_s: float = 10.0) -> int:  # pragma: no cover
        raise NotImplementedError

    def remove(self, name: str, deadline_s: float = 10.0) -> None:  # pragma: no cover
        raise NotImplementedError

    def names(self) -> set[str]:  # pragma: no cover
        raise NotImplementedError


class CgroupV2(CgroupDriver):
    version = "v2"

    def __init__(self, mount: Path) -> None:
        self.parent = mount / PARENT
        self.mount = mount

    def _dir(self, name: str) -> Path:
        return self.parent / name

    def create(self, name: str, limits: Limits) -> Placement:
        self.parent.mkdir(exist_ok=True)
        wanted = [
            c
            for c in ("memory", "cpu", "pids")
            if c in _read(self.mount / "cgroup.controllers").split()
        ]
        for directory in (self.mount, self.parent):
            for controller in wanted:
                try:
                    _write(directory / "cgroup.subtree_control", f"+{controller}")
                except OSError as exc:
                    log.info("cgroup v2: cannot enable %s in %s: %s", controller, directory, exc)
        directory = self._dir(name)
        directory.mkdir()
        applied: dict[str, object] = {"cgroup": "v2"}
        if limits.memory_bytes and (directory / "memory.max").exists():
            _write(directory / "memory.max", str(limits.memory_bytes))
            if (directory / "memory.swap.max").exists():
                _write(directory / "memory.swap.max", "0")
            applied["memory_limit_bytes"] = int(_read(directory / "memory.max"))
        if limits.cpu_millis:
            applied.update(self.set_cpu(name, limits.cpu_millis))
        if limits.pids_max and (directory / "pids.max").exists():
            _write(directory / "pids.max", str(limits.pids_max))
            applied["pids_max"] = int(_read(directory / "pids.max"))
        return Placement(
            version="v2",
            procs_files=(str(directory / "cgroup.procs"),),
            views=((str(directory), "/sys/fs/cgroup"),),
            applied=applied,
        )

    def set_cpu(self, name: str, cpu_millis: int) -> dict[str, object]:
        directory = self._dir(name)
        if not (directory / "cpu.max").exists():
            return {}
        quota = cpu_millis * CPU_PERIOD_US // 1000
        _write(directory / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        got_quota, got_period = _read(directory / "cpu.max").split()
        return {
            "cpu_quota_us": int(got_quota),
            "cpu_period_us": int(got_period),
            "cpu_quota": int(got_quota) / int(got_period),
        }

    def cpu_quota(self, name: str) -> float | None:
        quota, period = _read(self._dir(name) / "cpu.max").split()
        return None if quota == "max" else int(quota) / int(period)

    def kill(self, name: str, deadline_s: float = 10.0) -> int:
        directory = self._dir(name)
        if not directory.exists():
            return 0
        victims = _pids(directory)
        if (directory / "cgroup.kill").exists():
            _write(directory / "cgroup.kill", "1")
        else:
            _kill_until_empty(directory, deadline_s)
        if not _wait_until(lambda: not _pids(directory), deadline_s):
            raise CgroupError(f"cgroup {directory} still has processes after kill")
        return len(victims)

    def remove(self, name: str, deadline_s: float = 10.0) -> None:
        _rmdir_when_empty(self._dir(name), deadline_s)

    def names(self) -> set[str]:
        if not self.parent.is_dir():
            return set()
        return {p.name for p in self.parent.iterdir() if p.is_dir() and p.name[0] != "."}


class CgroupV1(CgroupDriver):
    version = "v1"

    def __init__(self, hierarchies: dict[str, Path]) -> None:
        # controller -> mountpoint of the hierarchy that carries it
        self.hierarchies = hierarchies

    def _dirs(self, name: str) -> dict[str, Path]:
        return {c: m / PARENT / name for c, m in self.hierarchies.items()}

    def create(self, name: str, limits: Limits) -> Placement:
        dirs = self._dirs(name)
        made: list[Path] = []
        try:
            for directory in dict.fromkeys(dirs.values()):
                directory.parent.mkdir(exist_ok=True)
                directory.mkdir()
                made.append(directory)
            applied = self._limit(dirs, limits)
        except OSError:
            for directory in made:
                try:
                    directory.rmdir()
                except OSError:
                    log.warning("could not undo cgroup %s", directory, exc_info=True)
            raise
        views = tuple((str(d), f"/sys/fs/cgroup/{c}") for c, d in dirs.items() if c != "freezer")
        procs = tuple(str(d / "cgroup.procs") for d in dict.fromkeys(dirs.values()))
        return Placement(version="v1", procs_files=procs, views=views, applied=applied)

    def _limit(self, dirs: dict[str, Path], limits: Limits) -> dict[str, object]:
        applied: dict[str, object] = {"cgroup": "v1"}
        memory = dirs.get("memory")
        if memory is not None and limits.memory_bytes:
            _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
            if (memory / "memory.memsw.limit_in_bytes").exists():
                _write(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            applied["memory_limit_bytes"] = int(_read(memory / "memory.limit_in_bytes"))
        if dirs.get("cpu") is not None and limits.cpu_millis:
            applied.update(self._set_cpu(dirs["cpu"], limits.cpu_millis))
        pids = dirs.get("pids")
        if pids is not None and limits.pids_max:
            _write(pids / "pids.max", str(limits.pids_max))
            applied["pids_max"] = int(_read(pids / "pids.max"))
        return applied

    def set_cpu(self, name: str, cpu_millis: int) -> dict[str, object]:
        cpu = self._dirs(name).get("cpu")
        return {} if cpu is None else self._set_cpu(cpu, cpu_millis)

    @staticmethod
    def _set_cpu(cpu: Path, cpu_millis: int) -> dict[str, object]:
        _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
        _write(cpu / "cpu.cfs_quota_us", str(cpu_millis * CPU_PERIOD_US // 1000))
        quota = int(_read(cpu / "cpu.cfs_quota_us"))
        period = int(_read(cpu / "cpu.cfs_period_us"))
        return {"cpu_quota_us": quota, "cpu_period_us": period, "cpu_quota": quota / period}

    def cpu_quota(self, name: str) -> float | None:
        cpu = self._dirs(name)["cpu"]
        quota = int(_read(cpu / "cpu.cfs_quota_us"))
        return None if quota < 0 else quota / int(_read(cpu / "cpu.cfs_period_us"))

    def kill(self, name: str, deadline_s: float = 10.0) -> int:
        dirs = self._dirs(name)
        freezer = dirs.get("freezer")
        frozen = False
        if freezer is not None and freezer.exists():
            # Freeze first so nothing forks between reading cgroup.procs and the kill.
            _write(freezer / "freezer.state", "FROZEN")
            frozen = _wait_until(lambda: _read(freezer / "freezer.state") == "FROZEN", 2.0)
        victims: set[int] = set()
        for directory in dict.fromkeys(dirs.values()):
            if directory.exists():
                victims.update(_pids(directory))
        for pid in victims:
            _signal(pid, signal.SIGKILL)
        if frozen and freezer is not None:
            _write(freezer / "freezer.state", "THAWED")
        for directory in dict.fromkeys(dirs.values()):
            if directory.exists():
                _kill_until_empty(directory, deadline_s)
        return len(victims)

    def remove(self, name: str, deadline_s: float = 10.0) -> None:
        for directory in dict.fromkeys(self._dirs(name).values()):
            _rmdir_when_empty(directory, deadline_s)

    def names(self) -> set[str]:
        found: set[str] = set()
        for mount in self.hierarchies.values():
            parent = mount / PARENT
            if parent.is_dir():
                found.update(p.name for p in parent.iterdir() if p.is_dir() and p.name[0] != ".")
        return found


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _kill_until_empty(directory: Path, deadline_s: float) -> None:
    def empty_after_kill() -> bool:
        pids = _pids(directory)
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        return not pids

    if not _wait_until(empty_after_kill, deadline_s):
        raise CgroupError(f"cgroup {directory} still has processes after SIGKILL")


def _rmdir_when_empty(directory: Path, deadline_s: float) -> None:
    def removed() -> bool:
        try:
            directory.rmdir()
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno == errno.EBUSY:
                return False
            raise
        return True

    if not _wait_until(removed, deadline_s):
        raise CgroupError(f"cgroup {directory} is still busy")


def detect() -> CgroupDriver | None:
    """The cgroup driver this host lets us use, or None (not root, no writable cgroupfs)."""
    probe_name = f".probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        mounts = _cgroup_mounts()
    except OSError:
        return None
    driver: CgroupDriver | None = None
    v2 = [Path(m) for m, kind, _ in mounts if kind == "cgroup2"]
    unified = next(
        (
            m
            for m in v2
            if (m / "cgroup.controllers").exists()
            and {"memory", "pids"} <= set(_read(m / "cgroup.controllers").split())
        ),
        None,
    )
    if unified is not None:
        driver = CgroupV2(unified)
    else:
        hierarchies: dict[str, Path] = {}
        for mountpoint, kind, options in mounts:
            if kind != "cgroup":
                continue
            for controller in _V1_CONTROLLERS:
                if controller in options and controller not in hierarchies:
                    hierarchies[controller] = Path(mountpoint)
        if "memory" in hierarchies:
            driver = CgroupV1(hierarchies)
    if driver is None:
        return None
    try:
        driver.create(probe_name, Limits(None, None, None))
        driver.remove(probe_name, deadline_s=2.0)
    except (OSError, CgroupError) as exc:
        log.info("cgroups not usable here (%s): sandboxes run without resource limits", exc)
        return None
    return driver
