"""Stopping a command past its deadline, or on an interrupt, inside a shell that stays alive.

Invariant: a command is stopped without a shell restart when it can be - SIGURG makes the
shell return from the sourced command while its processes get SIGTERM, then SIGKILL after
the grace period; only when no frame follows does the caller give up and restart. Once the
frame came, nothing the command started survives, and the shell has reaped its killed jobs
(so their notices are consumed before the next command, never shown in its output).
"""

import os
import signal
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List

from .procs import ProcessTracker, kill_processes, read_stat

if TYPE_CHECKING:  # annotations only
    from .bashproc import BashProcess


class Timeout(object):
    """Stops a command past its deadline: SIGURG makes the shell return from the
    sourced command; the command's processes get SIGTERM, then SIGKILL after the
    grace period. Gives up (shell restart) if no frame follows."""

    STEP = 0.05

    def __init__(
        self,
        tracker: ProcessTracker,
        kill_grace: float,
        clock: Callable[[], float],
        shell_pid: int,
        marker: str,
        since: int,
        now: float,
    ) -> None:
        self.tracker = tracker
        self.clock = clock
        self.shell_pid = shell_pid
        self.marker = marker
        self.since = since
        self.kill_at = now + kill_grace
        self.give_up_at = self.kill_at + max(1.0, kill_grace)
        self.signalled = {}  # type: Dict[int, int]
        self.next_step = now
        self.step(now)

    def _targets(self) -> Dict[int, Any]:
        return self.tracker.command_processes(self.marker, self.shell_pid, self.since)

    def step(self, now: float) -> bool:
        if now < self.next_step:
            return False
        self.next_step = now + self.STEP
        sig = signal.SIGTERM if now < self.kill_at else signal.SIGKILL
        try:  # first, so the shell returns before it could start the next command
            os.kill(self.shell_pid, signal.SIGURG)
        except OSError:
            pass
        for pid, info in self._targets().items():
            if pid in self.signalled and sig == signal.SIGTERM:
                continue  # TERM once; KILL every step until it is gone
            self.signalled[pid] = info.starttime
            for send, target in ((os.kill, pid), (os.killpg, info.pgid)):
                if send is os.killpg and info.pgid in (os.getpgrp(), self.shell_pid):
                    continue
                try:
                    send(target, sig)
                    if sig == signal.SIGTERM:
                        send(target, signal.SIGCONT)  # a stopped process cannot act on TERM
                except OSError:
                    pass
        return now >= self.give_up_at

    def finish(self) -> List[int]:
        """After the frame: make sure nothing the command started survives."""
        grace = max(0.0, self.kill_at - self.clock())
        report = kill_processes(
            self._targets, grace, {os.getpgrp(), self.shell_pid}, self.tracker.reaper, None
        )
        killed = sorted(set(self.signalled) | set(report["signalled"]))
        self._wait_reaped_by_shell(killed)
        return killed

    def _wait_reaped_by_shell(self, pids: List[int], limit_s: float = 1.0) -> None:
        """Wait (bounded) until the shell has reaped the killed jobs that are its
        children: it then knows they ended, and the next command's ``jobs`` consumes
        their notices, which would otherwise reach that command's output."""
        until = self.clock() + limit_s
        while self.clock() < until:
            pending = [p for p in pids if _zombie_child(p, self.shell_pid)]
            if not pending:
                return
            time.sleep(0.005)  # bash reaps in its SIGCHLD handler, within microseconds


def _zombie_child(pid: int, parent: int) -> bool:
    info = read_stat(pid)
    return info is not None and info.ppid == parent and info.state in "ZX"


def interrupt(tracker: ProcessTracker, proc: "BashProcess", since: int) -> int:
    """``POST /sessions/{name}/interrupt``: SIGINT to the running command's foreground
    process group (the newest job it started that still runs), not to its other jobs or
    any other session's; bash then abandons the rest of the command's line and the
    recovery line ends it with status 130. With no such job (a builtin loop) the shell
    is unwound as at a timeout. Returns the group signalled, 0 for none."""
    pgid = tracker.foreground_group(proc.pid, since)
    try:
        if pgid:
            os.killpg(pgid, signal.SIGINT)
        else:
            os.kill(proc.pid, signal.SIGURG)
        proc.send(proc.recover_line())
    except OSError:  # the shell or the group is gone: the command is ending anyway
        pass
    return pgid
