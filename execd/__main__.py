"""Entry point: ``python3 -m execd --port PORT --token-file FILE --workspace DIR``.

Start-up order matters: the config (and token) is read once, the App starts
its reaper and shell, the socket is bound, and only then is
``listening on HOST:PORT`` printed and flushed (``[ADDR]:PORT`` for an IPv6 host) - it
is the first line on stdout, so a caller that reads it can connect at once.

Shutdown is orderly: the SIGTERM/SIGINT handler only records the request (no
exception, no lock: it runs between two bytecodes of the main thread, which
may be inside ``Thread.start``). The main thread, woken through the signal
wakeup fd, stops the server (no new connection), ends idle keep-alive
connections, kills every process the sandbox started (a running command
returns), gives request threads ``SHUTDOWN_JOIN_S`` to finish, abandons the
rest (daemon threads) and exits 0. SIGKILL is the only way to exit otherwise.
"""

import faulthandler
import logging
import os
import select
import signal
import sys
from typing import Any, List, Optional

# execd never speaks TLS. http.server imports http.client, which loads the ssl
# module (libssl, ~2 MiB of RSS) only if it can; a None entry makes that
# optional import fail, in this process only (commands are separate programs).
sys.modules.setdefault("ssl", None)  # type: ignore[arg-type]

from .app import App  # noqa: E402
from .config import parse_args  # noqa: E402
from .server import Server  # noqa: E402

log = logging.getLogger("execd")


# Seconds request threads get to finish after the sandbox's processes are killed.
SHUTDOWN_JOIN_S = 5.0
# Seconds from a stop signal to a forced exit (with every thread's stack on stderr).
STOP_BOUND_S = 20.0


class StopRequest:
    """The signal that asked execd to stop. ``record`` is the signal handler: it only
    stores the number; ``wait`` (main thread) sleeps on the signal wakeup fd until then."""

    def __init__(self) -> None:
        self.signum = 0
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        signal.set_wakeup_fd(self._w)  # every signal writes a byte here: ``wait`` wakes

    def record(self, signum: int, _frame: Any) -> None:
        if not self.signum:
            self.signum = signum

    def wait(self) -> int:
        while not self.signum:
            select.select([self._r], [], [])
            try:
                while os.read(self._r, 512):
                    pass
            except BlockingIOError:
                pass
        return self.signum


def main(argv: Optional[List[str]] = None) -> int:
    cfg = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if cfg.verbose else logging.WARNING,
        stream=sys.stderr,
        format="execd %(levelname)s %(name)s: %(message)s",
    )
    # A fatal signal (SIGABRT from a supervisor that gave up waiting, SIGSEGV) prints
    # every thread's stack to stderr first, so a stuck execd says where it was stuck.
    faulthandler.enable(all_threads=True)
    app = App(cfg)
    stop = StopRequest()
    signal.signal(signal.SIGTERM, stop.record)
    signal.signal(signal.SIGINT, stop.record)
    signal.signal(signal.SIGCHLD, lambda _s, _f: app.reaper.notify())
    server: Optional[Server] = None
    try:
        app.start()
        if stop.signum:  # asked to stop while starting: never listen
            return 0
        server = Server((cfg.host, cfg.port), app, listen_fd=cfg.listen_fd)
        host, port = server.server_address[:2]
        server.serve_in_thread()
        shown = "[%s]" % str(host) if ":" in str(host) else str(host)  # IPv6: [ADDR]:PORT
        sys.stdout.write("listening on %s:%d\n" % (shown, port))
        sys.stdout.flush()
        stop.wait()
        log.info("signal %d: stopping", stop.signum)
        # A stop is bounded: if execd is still here STOP_BOUND_S later, every thread's
        # stack goes to stderr and the process exits (status 1) instead of hanging.
        faulthandler.dump_traceback_later(STOP_BOUND_S, exit=True)
        server.stop_serving()  # no new connection; idle keep-alive ones end
    finally:
        app.close()  # kills every process the sandbox started: a running command returns
        if server is not None:
            left = server.join_requests(SHUTDOWN_JOIN_S)
            if left:
                log.warning("%d request thread(s) still running at exit: abandoned", left)
    return 0


if __name__ == "__main__":
    code = main()
    # Every resource is released by now; skip interpreter teardown, where daemon
    # threads (idle keep-alive connections) could still hold the stderr lock.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
