"""The accept loop of execd's HTTP server, with a stop that is bounded.

``socketserver``'s ``serve_forever``/``shutdown`` pair waits without a bound for the
loop to notice the request to stop (and polls every ``poll_interval``). Here the loop
selects on the listening socket and on one end of a socket pair; ``stop`` writes to the
other end, so the ``select`` returns at once, and waits at most ``bound_s`` for the loop
to leave; if it is still inside an accept then, its stack is logged and the stop goes
on (the process is about to exit anyway).
"""

import logging
import selectors
import socket
import sys
import threading
import traceback
from typing import Callable, Optional

log = logging.getLogger("execd.server")


class AcceptLoop:
    def __init__(self, listening: socket.socket, accept_one: Callable[[], None], bound_s: float):
        self._listening = listening
        self._accept_one = accept_one
        self._bound_s = bound_s
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="execd-serve", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._listening, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._stop.is_set():
                ready = sel.select()
                if self._stop.is_set():
                    break
                if any(key.fileobj is self._listening for key, _ in ready):
                    self._accept_one()

    def stop(self) -> None:
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        thread = self._thread
        if thread is not None:
            thread.join(self._bound_s)
            if thread.is_alive():  # stuck inside one accept: say where, go on
                frame = sys._current_frames().get(thread.ident or -1)
                where = "".join(traceback.format_stack(frame)) if frame else "?"
                log.warning("accept loop still busy after %.0f s:\n%s", self._bound_s, where)
        for end in (self._wake_r, self._wake_w):
            end.close()
