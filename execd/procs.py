"""Process discovery, killing and reaping for execd.

execd must find every process the sandbox started, kill it on timeout or
reset, and reap what ends up as its child: on our machines PID 1 does not reap
orphans, and execd makes itself a child subreaper so that orphaned
descendants come back to it instead.

A process belongs to the sandbox when at least one tracker says so:
``tree`` (a descendant of execd; every shell is a child subreaper too, so what a
command orphans, even after setsid, stays below its session's shell) or ``cgroup`` (a
member of the cgroup execd was given). No marker variable is put in commands'
environment: Sandman's own variables are not theirs to see.

Invariants: execd never signals its own process group or a process it cannot
attribute to the sandbox, and never reaps a pid in the reaper's ``known`` set
(children that other code waits for, such as the shell or a git call);
spawning such a child and registering it happen under the reaper's lock so the
reaper cannot steal its exit status.
"""

import ctypes
import errno
import logging
import os
import signal
import time
from typing import Callable, Dict, Iterable, List, NamedTuple, Optional, Set

from .reaper import Reaper

log = logging.getLogger("execd.procs")

PR_SET_CHILD_SUBREAPER = 36
SYS_PIDFD_OPEN = 434  # the same number on every Linux architecture


class ProcInfo(NamedTuple):
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    starttime: int  # clock ticks since boot; with pid it names a process uniquely
    comm: str


def _read_small(path: str, limit: int = 4096) -> Optional[bytes]:
    """os.open/os.read: /proc scans read thousands of tiny files, io.open is slow."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while limit > 0:
            chunk = os.read(fd, min(limit, 65536))
            if not chunk:
                break
            chunks.append(chunk)
            limit -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)


def read_stat(pid: int, proc_root: str = "/proc") -> Optional[ProcInfo]:
    """Parse /proc/PID/stat; None when the process is gone."""
    data = _read_small("%s/%d/stat" % (proc_root, pid))
    if data is None:
        return None
    rparen = data.rfind(b")")
    comm = data[data.find(b"(") + 1 : rparen].decode("utf-8", "replace")
    fields = data[rparen + 2 :].split()
    try:
        return ProcInfo(
            pid,
            int(fields[1]),
            int(fields[2]),
            int(fields[3]),
            fields[0].decode(),
            int(fields[19]),
            comm,
        )
    except (IndexError, ValueError):
        return None


def scan(proc_root: str = "/proc") -> Dict[int, ProcInfo]:
    """Every process visible in /proc, zombies included."""
    out = {}  # type: Dict[int, ProcInfo]
    for name in os.listdir(proc_root):
        if name.isdigit():
            info = read_stat(int(name), proc_root)
            if info is not None:
                out[info.pid] = info
    return out


def is_running(pid: int, starttime: Optional[int] = None) -> bool:
    """True while the process exists and is not a zombie (and is the same one)."""
    info = read_stat(pid)
    if info is None or info.state in ("Z", "X", "x"):
        return False
    return starttime is None or info.starttime == starttime


def descendants(procs: Dict[int, ProcInfo], roots: Iterable[int]) -> Set[int]:
    children = {}  # type: Dict[int, List[int]]
    for info in procs.values():
        children.setdefault(info.ppid, []).append(info.pid)
    seen = set()  # type: Set[int]
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen


def boot_ticks() -> int:
    """Now, in the unit of /proc/PID/stat starttime."""
    return int(time.clock_gettime(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK"))


def subreaper_setter() -> Optional[Callable[[], None]]:
    """A function that makes the calling process a child subreaper, for ``preexec_fn``
    (the attribute survives execve): the libc function is looked up here, in the
    parent, so the forked child only makes the one call. None without libc's prctl."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def setter() -> None:
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    return setter


def set_child_subreaper() -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def pidfd_open(pid: int) -> Optional[int]:
    """A descriptor that turns readable when ``pid`` exits (Linux >= 5.3), or None."""
    opener = getattr(os, "pidfd_open", None)
    if opener is not None:
        try:
            return opener(pid)
        except OSError:
            return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.syscall(SYS_PIDFD_OPEN, pid, 0)
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    os.set_inheritable(fd, False)
    return fd


class Cgroup:
    """A cgroup (v1 or v2) that the shell and everything it starts is put into."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.version = "v2" if os.path.exists(os.path.join(path, "cgroup.controllers")) else "v1"

    def add(self, pid: int) -> None:
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(pid))

    def members(self) -> Set[int]:
        try:
            with open(os.path.join(self.path, "cgroup.procs")) as f:
                return {int(line) for line in f if line.strip()}
        except (OSError, ValueError):
            return set()

    def kill_all(self) -> None:
        kill_file = os.path.join(self.path, "cgroup.kill")
        if os.path.exists(kill_file):
            try:
                with open(kill_file, "w") as f:
                    f.write("1")
            except OSError:
                log.warning("cgroup.kill failed for %s", self.path, exc_info=True)


def _signal(pid: int, sig: int) -> bool:
    try:
        os.kill(pid, sig)
        return True
    except OSError as e:
        if e.errno not in (errno.ESRCH, errno.EPERM):
            raise
        return False


def kill_processes(
    collect: Callable[[], Dict[int, ProcInfo]],
    grace: float,
    protect_pgids: Set[int],
    reaper: Optional[Reaper] = None,
    cgroup: Optional[Cgroup] = None,
    poll: float = 0.01,
    clock: Callable[[], float] = time.monotonic,
) -> Dict[str, List[int]]:
    """SIGTERM everything ``collect()`` returns (and its process groups), give it
    ``grace`` seconds, then SIGKILL in rounds until ``collect()`` is empty.

    ``collect`` must return live (non-zombie) targets only. Returns the pids
    signalled and any that survived every round.
    """
    signalled = {}  # type: Dict[int, int]

    def hit(targets: Dict[int, ProcInfo], sig: int) -> None:
        for info in targets.values():
            if info.pid in signalled and signalled[info.pid] != info.starttime:
                continue  # pid reused by an unrelated process
            if _signal(info.pid, sig):
                signalled[info.pid] = info.starttime
            if info.pgid not in protect_pgids and info.pgid > 1:
                try:
                    os.killpg(info.pgid, sig)
                except OSError:
                    pass
            if sig == signal.SIGTERM:
                _signal(info.pid, signal.SIGCONT)  # a stopped process cannot act on TERM

    def wait_dead(targets: Dict[int, ProcInfo], until: float) -> None:
        while clock() < until and any(is_running(p, i.starttime) for p, i in targets.items()):
            time.sleep(poll)  # poll interval while the processes act on the signal

    targets = collect()
    if targets and grace > 0:
        hit(targets, signal.SIGTERM)
        wait_dead(targets, clock() + grace)
    survivors = []  # type: List[int]
    for _round in range(100):
        if cgroup is not None:
            cgroup.kill_all()
        targets = collect()  # again: catches what forked meanwhile
        if not targets:
            survivors = []
            break
        hit(targets, signal.SIGKILL)
        survivors = sorted(targets)
        wait_dead(targets, clock() + 1.0)
    if reaper is not None:
        reaper.reap_now()
    return {"signalled": sorted(signalled), "survivors": survivors}


class ProcessTracker:
    """Answers "which processes belong to the sandbox / to one command"."""

    def __init__(
        self,
        session: str,
        reaper: Reaper,
        track: Set[str],
        cgroup: Optional[Cgroup] = None,
    ) -> None:
        self.session = session
        self.reaper = reaper
        self.track = track
        self.cgroup = cgroup
        self.execd_pid = os.getpid()

    def sandbox_processes(self, exclude: Iterable[int] = ()) -> Dict[int, ProcInfo]:
        """Every live process the sandbox started, minus execd and ``exclude``."""
        procs = scan()
        picked = set()  # type: Set[int]
        if "tree" in self.track:
            picked |= descendants(procs, [self.execd_pid])
        if "cgroup" in self.track and self.cgroup is not None:
            picked |= self.cgroup.members()
        picked.discard(self.execd_pid)
        picked -= set(exclude)
        return {p: procs[p] for p in picked if p in procs and procs[p].state not in "ZXx"}

    def command_processes(
        self, marker: str, shell_pid: int, since_tick: int
    ) -> Dict[int, ProcInfo]:
        """Live processes one command started: children of the shell created after the
        command began (orphans included: the shell is their subreaper), their process
        groups and descendants."""
        procs = scan()
        shell = procs.get(shell_pid)
        shell_pgid = shell.pgid if shell is not None else shell_pid
        seeds = set()  # type: Set[int]
        for info in procs.values():
            # >=: a child started in the command's first clock tick is its own (a
            # background job started in that same tick by the previous one would be too)
            if info.ppid == shell_pid and info.starttime >= since_tick:
                seeds.add(info.pid)
        groups = {procs[p].pgid for p in seeds} - {shell_pgid, os.getpgrp()}
        seeds |= {p for p, i in procs.items() if i.pgid in groups}
        seeds |= descendants(procs, seeds)
        seeds -= {shell_pid, self.execd_pid}
        return {p: procs[p] for p in seeds if procs[p].state not in "ZXx"}

    def foreground_group(self, shell_pid: int, since_tick: int) -> int:
        """The process group of the running command's foreground job, as far as /proc
        can tell without a terminal: the newest live child of the shell started since
        the command began (jobs of earlier commands are older). 0 when there is none."""
        procs = scan()
        shell = procs.get(shell_pid)
        skip = {shell.pgid if shell is not None else shell_pid, os.getpgrp(), 0}
        jobs = [
            (i.starttime, i.pid, i.pgid)
            for i in procs.values()
            if i.ppid == shell_pid
            and i.starttime >= since_tick
            and i.state not in "ZXx"
            and i.pgid not in skip
        ]
        return max(jobs)[2] if jobs else 0

    def shell_processes(self, shell_pid: Optional[int], helpers: Set[int]) -> Dict[int, ProcInfo]:
        """One session's processes: its shell and the shell's tree (what its commands
        orphaned included: the shell is their subreaper), plus orphans of shells that
        died (execd's children that are not ``helpers``); never another live shell's."""
        procs = scan()
        roots = [p for p, i in procs.items() if i.ppid == self.execd_pid and p not in helpers]
        mine = descendants(procs, roots + ([shell_pid] if shell_pid else []))
        mine.update(roots)
        if shell_pid in procs:
            mine.add(shell_pid)
        return {p: procs[p] for p in mine if procs[p].state not in "ZXx"}
