"""The reaper: execd (a child subreaper) waits for zombie children nobody else waits for.

Woken by SIGCHLD through a self-pipe (``notify`` takes no lock, so it is safe in a signal
handler that re-enters itself), with a periodic pass as a safety net.
"""

import logging
import os
import select
import subprocess
import threading
from typing import Any, Callable, Dict, List, Optional, Set

log = logging.getLogger("execd.procs")


class Reaper:
    """Reaps zombie children of execd that nobody else waits for.

    ``notify`` runs in the SIGCHLD handler, so it takes no lock: a Python signal handler
    runs between bytecodes of the main thread, and one that took the lock of an
    ``Event`` could interrupt the same thread inside that ``Event.set`` (a second
    SIGCHLD during the first handler) and wait for itself forever (seen: execd hung at
    stop). It writes one byte to a self-pipe, which the reaper thread selects on.
    """

    def __init__(self, scan: Callable[[], Dict[int, Any]]) -> None:
        self._scan = scan  # procs.scan: every process by pid (passed in: procs imports us)
        self._lock = threading.Lock()
        self._known = set()  # type: Set[int]
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._stopped = False
        self._thread: Optional[threading.Thread] = None
        self.reaped_total = 0

    def start(self, interval: float = 2.0) -> None:
        t = threading.Thread(target=self._loop, args=(interval,), name="reaper", daemon=True)
        self._thread = t
        t.start()

    def stop(self) -> None:
        self._stopped = True
        self.notify()
        if self._thread is not None:
            self._thread.join(5.0)
        if self._thread is None or not self._thread.is_alive():
            w, self._wake_w = self._wake_w, -1
            for fd in (self._wake_r, w):
                try:
                    os.close(fd)
                except OSError:
                    pass

    def notify(self) -> None:
        """Called from the SIGCHLD handler: async-signal-safe, no lock."""
        fd = self._wake_w
        if fd < 0:
            return
        try:
            os.write(fd, b"\0")
        except OSError:
            pass  # the pipe is full (a wake-up is pending anyway) or closed at stop

    def spawn(self, start: Callable[[], "subprocess.Popen[Any]"]) -> "subprocess.Popen[Any]":
        """Run ``start()`` (which forks) and register the child's pid atomically."""
        with self._lock:
            child = start()
            self._known.add(child.pid)
            return child

    def forget(self, pid: int) -> None:
        with self._lock:
            self._known.discard(pid)

    def known(self) -> Set[int]:
        with self._lock:
            return set(self._known)

    def reap_now(self) -> List[int]:
        me = os.getpid()
        reaped = []
        with self._lock:
            for info in self._scan().values():
                if info.ppid != me or info.state != "Z" or info.pid in self._known:
                    continue
                try:
                    if os.waitpid(info.pid, os.WNOHANG)[0] == info.pid:
                        reaped.append(info.pid)
                except ChildProcessError:
                    pass
        self.reaped_total += len(reaped)
        return reaped

    def _loop(self, interval: float) -> None:
        while not self._stopped:
            # SIGCHLD wakes us; the interval is a safety net
            select.select([self._wake_r], [], [], interval)
            try:
                while os.read(self._wake_r, 512):
                    pass
            except OSError:
                pass  # drained (EAGAIN)
            if self._stopped:
                break
            try:
                self.reap_now()
            except OSError:
                log.warning("reaper pass failed", exc_info=True)
