"""HTTP/1.1 front of execd: route table, authentication, one JSON send helper.

A ``ThreadingHTTPServer`` with keep-alive gives one thread per connection, not
per request; sockets get TCP_NODELAY and every response is written with one
``sendall`` (status line, headers with Content-Length, body), so a small
answer never waits on Nagle's algorithm.

Invariants: every route but ``GET /health`` answers 401 unless the request
carries ``Authorization: Bearer <token>`` (compared with
``hmac.compare_digest``), and ``GET /health`` with an ``Authorization`` header
answers 401 unless it is the right one; the request body is always read in full (or the
connection closed) before answering, so keep-alive never desyncs; every error
is ``{"error": code, "detail": sentence}`` (``protocol.ErrorAnswer``) from ``send_json``;
the route table is ``protocol.ROUTES`` (shapes and auth) joined to ``App`` method names.

Shutdown (``__main__``): ``serve_in_thread`` serves from a thread so the main thread
stays free for signals; ``stop_serving`` stops accepting and ends every connection's
reading side (an idle keep-alive thread returns, a running request still answers);
``join_requests`` waits a bounded time for the connection threads and says how many were
abandoned. Once ``stopping`` is set, a request cut short by the shutdown is logged
without a traceback.
"""

import io
import json
import logging
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Optional, Tuple

from . import __version__, idempotency, limits, protocol, streaming
from .acceptor import AcceptLoop
from .app import App
from .routes import _REASONS, PATHS, QUERY_HANDLERS, ROUTES, match  # noqa: F401
from .wire import ApiError

log = logging.getLogger("execd.server")

# how long ``stop_serving`` waits for the accept loop to leave its current accept
STOP_ACCEPT_S = 5.0


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: Tuple[str, int], app: App, listen_fd: Optional[int] = None) -> None:
        """Bind ``address``, or (``listen_fd``) accept on that inherited TCP socket: a local
        sandbox's socket bound in the host's network namespace, while execd lives in an
        empty one. It is made non-inheritable here, so no command execd starts gets it."""
        self.app = app
        self.stopping = False
        self._lock = threading.Lock()
        self._connections: Dict[threading.Thread, socket.socket] = {}
        host = address[0]
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        address = (host, address[1])
        if listen_fd is None:
            if ":" in host:  # an IPv6 pod IP (an IPv6 or IPv6-first dual-stack cluster)
                self.address_family = socket.AF_INET6
            super().__init__(address, Handler)
        else:
            super().__init__(address, Handler, bind_and_activate=False)
            self.socket.close()
            self.socket = socket.socket(fileno=listen_fd)
            self.socket.set_inheritable(False)
            self.server_address = self.socket.getsockname()
            try:
                self.server_activate()
            except BaseException:
                self.server_close()
                raise
        self._acceptor = AcceptLoop(self.socket, self._accept_one, STOP_ACCEPT_S)

    def serve_in_thread(self) -> None:
        self._acceptor.start()

    def server_activate(self) -> None:
        super().server_activate()
        # a connection reset between select and accept must not block the accept loop
        self.socket.setblocking(False)

    def get_request(self) -> Tuple[socket.socket, Any]:
        sock, address = self.socket.accept()  # BlockingIOError: the server just returns
        sock.setblocking(True)
        return sock, address

    def _accept_one(self) -> None:
        try:
            request, client_address = self.get_request()
        except OSError:
            return  # gone between select and accept (or EAGAIN)
        try:
            self.process_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
            self.shutdown_request(request)

    def process_request(self, request: Any, client_address: Any) -> None:
        """One daemon thread per connection, registered (with its socket) BEFORE it
        starts, so ``stop_serving`` after ``shutdown`` sees every connection."""
        thread = threading.Thread(target=self._connection, args=(request, client_address))
        thread.daemon = True
        with self._lock:
            if not limits.admit(request, len(self._connections), self.app.cfg.limits):
                return
            self._connections[thread] = request
        thread.start()

    def _connection(self, request: Any, client_address: Any) -> None:
        try:
            self.process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._connections.pop(threading.current_thread(), None)

    def stop_serving(self) -> None:
        """Stop accepting, close the listening socket, end every connection's reads."""
        self.stopping = True
        self._acceptor.stop()
        self.server_close()
        with self._lock:
            sockets = list(self._connections.values())
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RD)
            except OSError:
                pass  # already closed by its thread

    def join_requests(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for the connection threads; how many still run."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            threads: List[threading.Thread] = list(self._connections)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(1 for t in threads if t.is_alive())

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-request is normal, and so is a request cut short by
        shutdown; anything else is logged (through logging, never a bare print from a
        daemon thread)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (ConnectionError, TimeoutError, socket.timeout)):
            log.debug("client %s went away: %s", client_address, exc)
        elif self.stopping:
            log.info("request from %s cut short by shutdown: %r", client_address, exc)
        else:
            log.warning("request from %s failed", client_address, exc_info=True)


class Headers(dict):
    """Request headers by lower-cased name (the only lookups execd makes)."""

    def get(self, name: str, default: Any = None) -> Any:
        return dict.get(self, name.lower(), default)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "execd/" + __version__
    timeout = 3600  # an idle keep-alive connection is dropped after an hour
    MAX_HEADERS = 100
    MAX_LINE = 65536

    def setup(self) -> None:
        super().setup()
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Every read has a deadline per request phase (limits.py), not a per-recv timeout.
        self.rfile.close()
        self.reader = limits.DeadlineReader(self.request, self.server.app.cfg.limits)  # type: ignore[attr-defined]
        self.rfile = io.BufferedReader(self.reader, 65536)

    def handle_one_request(self) -> None:
        self.requestline = ""
        self.reader.wait_request()
        super().handle_one_request()
        if self.reader.timed_out == limits.HEAD:  # slow-loris: tell it why, then close
            self.close_connection = True
            self.reader.answer()
            self.request_version = "HTTP/1.1"
            self.send_json(
                408,
                _error(
                    "header_timeout",
                    "the request line and headers must arrive within %gs"
                    % self.server.app.cfg.limits.header_timeout,  # type: ignore[attr-defined]
                ),
            )

    def send_error(
        self, code: int, message: Optional[str] = None, explain: Optional[str] = None
    ) -> None:
        """http.server's own refusals (a request line over 64 KiB, a method with no
        ``do_`` handler) as ``{error, detail}`` JSON; an unknown method is a 405."""
        self.close_connection = True
        self.request_version = "HTTP/1.1"
        if code == 414:
            self.send_json(414, _error("uri_too_long", "the request line is over 64 KiB"))
        elif code == 501:
            self.send_json(
                405, _error("method_not_allowed", "execd does not take %s" % self.command[:32])
            )
        else:
            self.send_json(code, _error("bad_request", message or "the request was refused"))

    def parse_request(self) -> bool:
        """Request line and headers, without the email package: the stock parser
        costs ~60 us per request, a quarter of execd's CPU for a short command."""
        self.close_connection = True
        self.command = ""
        raw = self.raw_requestline  # type: ignore[attr-defined]  # set by handle_one_request
        self.requestline = str(raw, "iso-8859-1").rstrip("\r\n")
        words = self.requestline.split()
        if len(words) != 3 or not words[2].startswith("HTTP/1."):
            self.request_version = "HTTP/1.0"
            self.send_json(400, _error("bad_request", "expected METHOD PATH HTTP/1.x"))
            return False
        self.command, self.path, self.request_version = words
        headers = Headers()
        for _ in range(self.MAX_HEADERS + 1):
            line = self.rfile.readline(self.MAX_LINE + 1)
            if len(line) > self.MAX_LINE:
                self.send_json(
                    431,
                    _error(
                        "header_too_long", "a header line is longer than %d bytes" % self.MAX_LINE
                    ),
                )
                return False
            if line in (b"\r\n", b"\n", b""):
                break
            name, sep, value = str(line, "iso-8859-1").partition(":")
            if not sep or not name.strip():
                self.send_json(400, _error("bad_request", "malformed header line"))
                return False
            headers[name.strip().lower()] = value.strip()
        else:
            self.send_json(
                431,
                _error("too_many_headers", "more than %d headers" % self.MAX_HEADERS),
            )
            return False
        self.headers = headers  # type: ignore[assignment]
        self.reader.answer()
        if (
            headers.get("expect", "").lower() == "100-continue"
            and self.request_version != "HTTP/1.0"
            and _length_fits(headers, self.server.app.cfg.max_body_bytes)  # type: ignore[attr-defined]
        ):
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for it on big bodies
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        if self.request_version == "HTTP/1.0":
            self.close_connection = "keep-alive" not in tokens
        else:
            self.close_connection = "close" in tokens
        return True

    def log_message(self, format: str, *args: Any) -> None:
        if self.server.app.cfg.verbose:  # type: ignore[attr-defined]
            log.info("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def _dispatch(self, method: str) -> None:
        app = self.server.app  # type: ignore[attr-defined]
        path, _, query = self.path.partition("?")
        try:
            if query and limits.credential_in_query(query):
                self.requestline = limits.redact_query(self.requestline)
                self.close_connection = True  # its body, if any, is left unread
                raise ApiError(
                    400,
                    "token_in_query",
                    "send the token as Authorization: Bearer <token>, never in the URL",
                )
            raw = self._read_body(app.cfg.max_body_bytes)
            route, params, known = match(method, path)
            credentials = self.headers.get("Authorization")
            # /health needs no token (a kubelet probe sends none), but one that is sent is
            # checked: a caller can tell its own sandbox from another on a reused address.
            checked = route is None or route.auth or credentials is not None
            if checked and not app.authorized(credentials):
                raise ApiError(401, "unauthorized", "send Authorization: Bearer <token>")
            if route is None:
                if known:
                    raise ApiError(
                        405, "method_not_allowed", "%s does not take %s" % (path, method)
                    )
                raise ApiError(404, "not_found", "no route %s" % path)
            body = _decode(raw)
            ticket = idempotency.claim(
                app.keys,
                self.headers.get(idempotency.HEADER),
                (method, path, raw),
                lambda: self.server.stopping,  # type: ignore[attr-defined]
            )
            if isinstance(ticket, idempotency.Recorded):
                self.send_recorded(ticket)
                return
            try:
                kwargs = dict(params, query=query) if route.handler in QUERY_HANDLERS else params
                result = getattr(app, route.handler)(body, **kwargs)
                if isinstance(result, streaming.Streamed):
                    self.send_stream(result, ticket)
                else:
                    data = json.dumps(result).encode()
                    if ticket is not None:  # recorded before it is sent: a cut loses nothing
                        ticket.finish(idempotency.Recorded(200, "json", data))
                    self.send_body(200, data)
            finally:
                if ticket is not None:
                    ticket.abandon()  # refused or failed (a no-op once finished)
        except ApiError as e:
            self.send_json(e.status, e.body())
        except Exception as e:  # the one place that turns a bug into a 500, logged
            if self.server.stopping:  # type: ignore[attr-defined]  # the shell is going away
                log.info("%s %s cut short by shutdown: %r", method, path, e)
            else:
                log.exception("%s %s failed", method, path)
            self.send_json(500, _error("internal", "%s: %s" % (type(e).__name__, e)))

    def _read_body(self, limit: int) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None:
            if self.headers.get("Transfer-Encoding"):
                self.close_connection = True
                raise ApiError(411, "length_required", "send a Content-Length, not chunks")
            return b""
        try:
            n = int(length)
        except ValueError:
            self.close_connection = True
            raise ApiError(400, "bad_request", "Content-Length is not a number") from None
        if n < 0 or n > limit:
            self.close_connection = True
            raise ApiError(413, "too_large", "the body may have at most %d bytes" % limit)
        if not n:
            return b""
        self.reader.expect_body()
        try:
            raw = self.rfile.read(n)
        except limits.RequestTimeout as e:
            self.close_connection = True
            raise ApiError(
                408, "body_timeout", "the %d-byte body did not arrive within %gs" % (n, e.limit)
            ) from None
        finally:
            self.reader.answer()
        if len(raw) < n:
            self.close_connection = True
            raise ApiError(400, "short_body", "the body ended after %d of %d bytes" % (len(raw), n))
        return raw

    def send_json(self, status: int, obj: Dict[str, Any]) -> None:
        self.send_body(status, json.dumps(obj).encode())

    def send_body(self, status: int, body: bytes, replayed: bool = False) -> None:
        head = [
            "HTTP/1.1 %d %s" % (status, _REASONS.get(status, "Error")),
            "Content-Type: application/json",
            "Content-Length: %d" % len(body),
        ]
        if replayed:
            head.append(idempotency.REPLAYED + ": true")
        if status == 401:
            head.append("WWW-Authenticate: Bearer")
        if self.close_connection:
            head.append("Connection: close")
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        self.log_request(status, len(body))

    def send_recorded(self, answer: idempotency.Recorded) -> None:
        """A repeated Idempotency-Key: the first call's answer (a stream's final frame)."""
        if answer.kind == "json":
            return self.send_body(answer.status, answer.body, replayed=True)
        sent = streaming.replay(self.request, self.close_connection, answer.body)
        self.log_request(answer.status, sent)

    def send_stream(self, streamed: streaming.Streamed, ticket: Optional[Any]) -> None:
        out = streaming.respond(streamed, self.request, self.close_connection, ticket)
        self.close_connection = self.close_connection or out.broken
        self.log_request(200, out.sent_bytes)


def _error(code: str, detail: str) -> Dict[str, Any]:
    return protocol.ErrorAnswer(code, detail).to_json()


def _length_fits(headers: "Headers", limit: int) -> bool:
    length = headers.get("content-length", "")
    return length.isdigit() and int(length) <= limit


def _decode(raw: bytes) -> Any:
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, "bad_json", "the body is not valid JSON: %s" % e) from None
