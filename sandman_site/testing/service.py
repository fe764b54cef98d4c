"""A Kubernetes Service for tests: each new connection goes to the endpoint chosen then.

kube-proxy picks an endpoint per connection among the ready pods the Service's selector
matches (https://kubernetes.io/docs/reference/networking/virtual-ips/); a connection stays
with its pod until one side closes it, and a Service with no endpoints refuses
connections. :class:`LabelService` does the same over loopback: ``route()`` names the
backend port at each accept (the test reads the pods' labels from the stand-in), and with
none the connection is closed at once. Bytes are relayed unchanged in both directions.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


class LabelService:
    """Listens on 127.0.0.1; ``close()`` stops it and closes every relayed connection."""

    def __init__(self, route: Callable[[], int | None]) -> None:
        self._route = route
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.routed: list[int | None] = []  # the backend port chosen at each accept
        threading.Thread(target=self._serve, name="label-service", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            port = self._route()
            self.routed.append(port)
            try:
                if port is None:
                    raise ConnectionRefusedError("no endpoints")
                upstream = socket.create_connection(("127.0.0.1", port))
            except OSError:
                conn.close()
                continue
            with self._lock:
                self._open |= {conn, upstream}
            for src, dst in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass  # the other pump closed the pair, or a peer reset it
        finally:
            for s in (src, dst):
                self._drop(s)

    def _drop(self, s: socket.socket) -> None:
        with self._lock:
            self._open.discard(s)
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed
        s.close()

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            sockets = list(self._open)
        for s in sockets:
            self._drop(s)
