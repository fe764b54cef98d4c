"""A session's interrupts (``POST /sessions/{name}/interrupt``), one command at a time.

``timeouts.interrupt`` SIGINTs the running command's foreground job (SIGURG unwinds a
builtin that runs instead). An interrupt can come as soon as the session says it is busy:
before the command is sent to bash, before bash has read it, or before it forked its first
job -- and there is no job to signal yet, while SIGURG is a no-op in the shell until the
command runs. Such an interrupt is PENDING, never lost: it is applied once the command is
sent, and the first job the command starts gets SIGINT (looked for every
``PENDING_POLL_S`` for ``PENDING_WAIT_S``: by the interrupting thread while the command's
own waits in ``select``, and by the command's loop, ``poll``).

Invariants: the recovery line of a command is sent at most once, and only after its
control line (``sent``); a pending interrupt ends with its command (``ended``).
"""

import os
import signal
import threading
import time
from typing import TYPE_CHECKING, Callable, Optional, Tuple

from .timeouts import interrupt

if TYPE_CHECKING:  # names used in annotations only
    from .bashproc import BashProcess
    from .procs import ProcessTracker

PENDING_POLL_S = 0.005  # how often a pending interrupt looks for the command's first job
PENDING_WAIT_S = 2.0  # for how long (a command that starts no job: its SIGURG unwound it)


class Interrupts:
    def __init__(
        self, tracker: "ProcessTracker", clock: Callable[[], float], busy: Callable[[], bool]
    ) -> None:
        self.tracker, self.clock, self._busy = tracker, clock, busy
        self._lock = threading.Lock()
        self._current: Optional[Tuple["BashProcess", int]] = None  # running: shell, since
        self.interrupted = False  # the running command was interrupted
        self._pending = False
        self._pending_since = 0.0

    def request(self) -> Optional[int]:
        """An interrupt: the process group sent SIGINT (0: none yet, or a builtin was
        running, unwound instead), None when no command runs."""
        with self._lock:
            if self._current is None:
                if not self._busy():
                    return None
                self._pend()  # accepted, not sent yet: ``sent`` applies it
                return 0
            if self._pending:
                return 0  # one recovery line per command
            self.interrupted = True
            current = self._current
            pgid = interrupt(self.tracker, *current)
            if pgid:
                return pgid
            self._pend()
        # Sent, but no job yet (or a builtin, already unwound): the command's thread may
        # wait in select, so this one looks for the first job, for a bounded time.
        until = self.clock() + PENDING_WAIT_S
        while self._pending and self._current is current and self.clock() < until:
            pgid = self._resolve(*current)
            if pgid:
                return pgid
            time.sleep(PENDING_POLL_S)  # polling /proc for the job bash is forking
        return 0

    def staged(self) -> None:
        """A command is about to be sent (a pending interrupt is kept for it)."""
        with self._lock:
            self.interrupted = False

    def sent(self, proc: "BashProcess", since: int) -> None:
        """Its control line is out: interruptible from now on."""
        with self._lock:
            self._current = (proc, since)
            if self._pending:  # an interrupt came while it was being staged
                self.interrupted = True
                if interrupt(self.tracker, proc, since):
                    self._pending = False

    def ended(self) -> None:
        with self._lock:
            self._current, self._pending = None, False

    def poll(self, proc: "BashProcess", since: int, now: float, wait: float) -> float:
        """The command's loop: a pending interrupt's job signalled once it exists; the
        loop's next wait (shorter while one is pending)."""
        if self._pending and now - self._pending_since < PENDING_WAIT_S:
            self._resolve(proc, since)
            return min(wait, PENDING_POLL_S)
        return wait

    def _pend(self) -> None:
        self._pending, self._pending_since = True, self.clock()

    def _resolve(self, proc: "BashProcess", since: int) -> int:
        with self._lock:
            if not self._pending:
                return 0
            pgid = self.tracker.foreground_group(proc.pid, since)
            if pgid:
                self._pending = False
                try:
                    os.killpg(pgid, signal.SIGINT)
                except OSError:  # gone already: the command is ending anyway
                    pass
            return pgid
