"""Entry point: ``python3 -m execd --port PORT --token-file FILE --workspace DIR``.

Start-up order matters: the config (and token) is read once, the App starts
its reaper and shell, the socket is bound, and only then is
``listening on HOST:PORT`` printed and flushed - it is the first line on
stdout, so a caller that reads it can connect at once. SIGTERM and SIGINT
stop the server and kill every process the sandbox started before exiting.
"""

import logging
import os
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


def main(argv: Optional[List[str]] = None) -> int:
    cfg = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if cfg.verbose else logging.WARNING,
        stream=sys.stderr,
        format="execd %(levelname)s %(name)s: %(message)s",
    )
    app = App(cfg)

    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGCHLD, lambda _s, _f: app.reaper.notify())
    try:
        app.start()
        server = Server((cfg.host, cfg.port), app)
        host, port = server.server_address[:2]
        sys.stdout.write("listening on %s:%d\n" % (str(host), port))
        sys.stdout.flush()
        try:
            server.serve_forever(poll_interval=0.5)
        finally:
            server.server_close()
    except SystemExit as e:
        return 0 if e.code in (128 + signal.SIGTERM, 128 + signal.SIGINT) else int(e.code or 0)
    finally:
        app.close()
    return 0


if __name__ == "__main__":
    code = main()
    # Every resource is released by now; skip interpreter teardown, where daemon
    # threads (idle keep-alive connections) could still hold the stderr lock.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
