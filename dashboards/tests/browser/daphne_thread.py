"""Daphne serving the real ASGI app from a thread of the test process.

Why in-process: the embedded default's channel layer is in memory, so a publish reaches
the dashboard's websocket only from the process that serves it; and the test's database
(pytest-django's, SQLite or PostgreSQL) is then the server's database with no extra set-up.
Channels' ``ChannelsLiveServerTestCase`` runs Daphne in another process instead, which
needs a shared channel layer (Redis) and refuses in-memory SQLite.

Daphne runs on Twisted's asyncio reactor, which can run only once per process: start one
server per test session (the session fixture does) and stop it at the end.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connections


class DaphneThread:
    def __init__(self, application: Any) -> None:
        self.application = application
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._server: Any = None
        self._failure: BaseException | None = None

    def start(self, timeout_s: float = 30.0) -> str:
        """Listen on a free loopback port; return the base URL once it accepts connections."""
        from daphne.server import Server  # installs Twisted's asyncio reactor on import

        self._server = Server(
            application=self.application,
            endpoints=["tcp:port=0:interface=127.0.0.1"],
            signal_handlers=False,
            ready_callable=self._ready.set,
            verbosity=0,
        )
        self._thread = threading.Thread(target=self._run, name="test-daphne", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s):
            raise RuntimeError(f"daphne did not start within {timeout_s} s")
        if self._failure is not None or not self._server.listening_addresses:
            raise RuntimeError("daphne failed to listen") from self._failure
        host, port = self._server.listening_addresses[0]
        return f"http://{host}:{port}"

    def _run(self) -> None:
        try:
            self._server.run()
        except BaseException as exc:  # noqa: BLE001 - handed to start() / stop() callers
            self._failure = exc
            self._ready.set()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        from twisted.internet import reactor

        return reactor._asyncioEventloop  # type: ignore[attr-defined]

    def stop(self, timeout_s: float = 30.0) -> None:
        from twisted.internet import reactor

        if self._thread is None:
            return
        # Channels' database_sync_to_async (websocket auth, per-message connection checks)
        # runs in asgiref's one long-lived sync thread: close its connection there.
        closing = asyncio.run_coroutine_threadsafe(
            sync_to_async(connections.close_all)(), self.loop
        )
        closing.result(timeout_s)
        reactor.callFromThread(self._server.stop)  # type: ignore[attr-defined]
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise RuntimeError(f"daphne did not stop within {timeout_s} s")
        self._thread = None
