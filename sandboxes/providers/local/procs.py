"""Host processes of local sandboxes: identity that survives pid reuse, killing, reaping.

A pid alone is not an identity (pids are reused), so every sandbox record stores the
pid together with its start time from ``/proc/<pid>/stat``; a process is the sandbox's
only when both match.

Invariants:
* Every child the provider spawned is reaped (``waitpid``) once it exits: PID 1 on our
  hosts does not reap, so an unreaped child is a zombie forever.
* Signals go only to processes that are verifiably the sandbox's (pid + start time, or
  the ``SANDMAN_SANDBOX`` marker in their environment), never to a bare pid.
"""

from __future__ import annotations

import os
import signal


def _stat_fields(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after ``(comm)`` (state first), or None if no such
    process. ``comm`` may hold spaces and parentheses, hence the split at the last ``)``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def start_time(pid: int) -> int | None:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot), or None if no such process."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def state(pid: int) -> str | None:
    """The one-letter process state (R, S, Z, ...), or None if there is no such process."""
    fields = _stat_fields(pid)
    return fields[0].decode() if fields else None


def is_ours(pid: int | None, started: int | None) -> bool:
    """True while ``pid`` is the very process recorded (and has not exited)."""
    if not pid or started is None:
        return False
    return start_time(pid) == started and state(pid) not in ("Z", "X", None)


def _ppids() -> dict[int, tuple[int, bytes]]:
    """pid -> (ppid, state) for every process /proc shows."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(entry)
        if fields is not None and len(fields) > 1:
            table[int(entry)] = (int(fields[1]), fields[0])
    return table


# Kernels built with CONFIG_PROC_CHILDREN list each thread's children in a file.
_CHILDREN_FILES = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def _listed_children(pid: int) -> list[int]:
    """Children of ``pid`` from ``/proc/<pid>/task/*/children``: O(threads of pid), where
    a full ``/proc`` scan is O(every process) and the controller's loop asks per sandbox
    with hundreds of sandbox processes alive."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    found: list[int] = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as handle:
                found.extend(int(c) for c in handle.read().split())
        except OSError:
            continue  # the thread ended meanwhile
    return found


def children(pid: int) -> list[int]:
    """Live direct children of ``pid``."""
    if _CHILDREN_FILES:
        return [c for c in _listed_children(pid) if state(c) not in ("Z", "X", None)]
    return [c for c, (ppid, st) in _ppids().items() if ppid == pid and st not in (b"Z", b"X")]


def zombie_children(pid: int) -> list[int]:
    """Exited, unreaped direct children of ``pid``."""
    return [c for c, (ppid, st) in _ppids().items() if ppid == pid and st == b"Z"]


def reap(pid: int) -> bool:
    """Collect ``pid`` if it is our exited child. True once it is gone for good."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        # Not our child (or already reaped): gone when /proc has no live entry.
        return state(pid) in (None, "Z", "X")
    return done == pid


def send(pid: int, started: int | None, sig: int) -> bool:
    """Signal the recorded process if it is still that process."""
    if not is_ours(pid, started):
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def marked(name: str) -> list[int]:
    """Live processes whose environment carries ``SANDMAN_SANDBOX=<name>``.

    The last resort for sandboxes without isolation or cgroup: a process that escaped
    its parent (double fork) still inherited the marker unless it cleared its env.
    """
    needle = f"SANDMAN_SANDBOX={name}".encode()
    found = []
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                environ = handle.read().split(b"\0")
        except OSError:
            continue
        if needle in environ and state(int(entry)) not in ("Z", "X", None):
            found.append(int(entry))
    return found


def kill_marked(name: str) -> int:
    victims = marked(name)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(victims)
