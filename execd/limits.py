"""What execd refuses from a client it cannot trust: slow or endless requests, too many
connections, credentials in the URL.

``DeadlineReader`` is the raw stream under each connection's ``rfile``. It gives every
read a *total* deadline for the phase the connection is in, not a per-``recv`` timeout
(a client dripping one byte a second would reset a per-recv timeout for ever):

* ``idle``: waiting for the next request line on a kept-alive connection
  (``--idle-timeout``); the connection is closed without an answer when it runs out;
* ``head``: from the first byte of a request to the end of its headers
  (``--header-timeout``, a slow-loris client); answered ``408 header_timeout``;
* ``body``: the whole declared body (``--body-timeout``, a body that never finishes);
  answered ``408 body_timeout``;
* ``answer``: the handler runs and writes; writes are bounded by the body timeout (a
  client that never reads its answer cannot hold a thread for ever).

``admit`` caps the open connections (``--max-connections``): one more is answered
``429 too_many_connections`` and closed at once from the accepting thread, so the
connections already open, and new ones once some close, keep being served.

``check_query`` refuses a token sent in the query string (``400 token_in_query``), whatever
the Authorization header says: URLs end up in logs and proxies, so such a token counts
as leaked and the caller must be fixed, not served.

Invariants: a deadline always comes from the injected clock (``time.monotonic``); a
``RequestTimeout`` is a ``socket.timeout``, so ``http.server`` treats one raised while it
reads a request line as the timeout it already handles (it closes the connection).
Standard library only, Python 3.8.
"""

import io
import json
import socket
import time
from typing import Any, Callable, NamedTuple, Optional
from urllib.parse import parse_qsl

IDLE = "idle"
HEAD = "head"
BODY = "body"
ANSWER = "answer"

# Query parameters that carry a credential in the usual conventions (OAuth's access_token,
# ad-hoc token/key/auth); any of them is refused.
CREDENTIAL_PARAMS = frozenset(
    ("token", "access_token", "bearer", "auth", "authorization", "key", "api_key", "apikey")
)


class Limits(NamedTuple):
    idle_timeout: float
    header_timeout: float
    body_timeout: float
    max_connections: int


class RequestTimeout(socket.timeout):
    """A phase's deadline passed; ``phase`` says which."""

    def __init__(self, phase: str, limit: float) -> None:
        super().__init__("%s timeout after %gs" % (phase, limit))
        self.phase = phase
        self.limit = limit


class DeadlineReader(io.RawIOBase):
    """A socket's reading side whose reads share one deadline per phase (see the module)."""

    def __init__(
        self, sock: socket.socket, limits: Limits, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._sock = sock
        self._limits = limits
        self._clock = clock
        self.phase = ANSWER
        self.timed_out = None  # type: Optional[str]
        self._deadline = 0.0
        self._limit = 0.0

    def readable(self) -> bool:
        return True

    def _enter(self, phase: str, limit: float) -> None:
        self.phase = phase
        self._limit = limit
        self._deadline = self._clock() + limit

    def wait_request(self) -> None:
        """Before each request line: the idle deadline (a head deadline once bytes come)."""
        self.timed_out = None
        self._enter(IDLE, self._limits.idle_timeout)

    def expect_body(self) -> None:
        self._enter(BODY, self._limits.body_timeout)

    def answer(self) -> None:
        """Reading is done for this request; writes get the body timeout."""
        self.phase = ANSWER
        self._sock.settimeout(self._limits.body_timeout)

    def readinto(self, buffer: Any) -> int:
        if self.phase == ANSWER:  # a read outside a request's phases (none expected)
            self._enter(BODY, self._limits.body_timeout)
        remaining = self._deadline - self._clock()
        if remaining <= 0:
            raise self._timeout()
        self._sock.settimeout(remaining)
        try:
            n = self._sock.recv_into(buffer)
        except socket.timeout:
            raise self._timeout() from None
        if n and self.phase == IDLE:
            self._enter(HEAD, self._limits.header_timeout)
        return n

    def _timeout(self) -> RequestTimeout:
        self.timed_out = self.phase
        return RequestTimeout(self.phase, self._limit)


def error_bytes(status: int, reason: str, code: str, detail: str, extra: str = "") -> bytes:
    """A whole ``{error, detail}`` answer that closes the connection."""
    body = json.dumps({"error": code, "detail": detail}).encode()
    head = (
        "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
        "%sConnection: close\r\n\r\n" % (status, reason, len(body), extra)
    )
    return head.encode() + body


def admit(sock: socket.socket, open_connections: int, limits: Limits) -> bool:
    """True if one more connection may be served; else answer 429 on it and close it."""
    if open_connections < limits.max_connections:
        return True
    answer = error_bytes(
        429,
        "Too Many Requests",
        "too_many_connections",
        "execd serves at most %d connections at once; close one or retry later"
        % limits.max_connections,
        "Retry-After: 1\r\n",
    )
    try:
        sock.settimeout(1.0)  # a fresh socket's send buffer takes this at once
        sock.sendall(answer)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # the client is already gone: closing is all that is left
    finally:
        sock.close()
    return False


def credential_in_query(query: str) -> Optional[str]:
    """The first credential-carrying parameter name in ``query``, or None."""
    for name, _value in parse_qsl(query, keep_blank_values=True):
        if name.strip().lower() in CREDENTIAL_PARAMS:
            return name
    return None


def redact_query(requestline: str) -> str:
    """The request line with its query string replaced, for logs."""
    target_start = requestline.find(" ")
    question = requestline.find("?", target_start)
    if question < 0:
        return requestline
    target_end = requestline.find(" ", question)
    end = requestline[target_end:] if target_end >= 0 else ""
    return requestline[:question] + "?<redacted>" + end
