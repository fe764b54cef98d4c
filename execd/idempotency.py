"""Safe retries: the ``Idempotency-Key`` table of one execd (issue 14 item 5).

A mutating call (every ``POST`` except the two file reads) that carries an
``Idempotency-Key`` header is run once per key. A repeat of the key with the same request
gets the first call's recorded answer (with ``Idempotent-Replayed: true``), or - while the
first call still runs - waits for it; the command is never run twice. This is what makes
it safe for a client to resend a command after a connection error: without a key it
cannot know whether a cut-off command ran (the paper's "commands are sent once").

Rules a reader must not break:
* A key is claimed (``begin``) before the handler runs and settled exactly once: ``finish``
  records the answer that is about to be sent (recorded BEFORE sending, so a connection
  that breaks while sending loses nothing), ``abandon`` forgets the key when the call was
  refused (a 4xx such as 409 ``busy``: nothing ran, so a retry may run it).
* The same key with another request (method, path or body) is 422
  ``idempotency_key_reused``, never the other request's answer.
* The table is bounded: at most ``max_keys`` keys (recorded answers are evicted oldest
  first; when every key is still running, a new one is 429) and ``max_bytes`` of recorded
  answers; a recorded answer is kept ``ttl_s`` seconds. A key evicted or expired is
  forgotten: reusing it later runs the call again.
* All state lives on a ``KeyTable`` the ``App`` owns; time comes from ``clock``.
"""

import threading
import time
from collections import OrderedDict
from typing import Callable, NamedTuple, Optional, Tuple, Union

from .wire import ApiError

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
READS = frozenset(["/files/read", "/files/read_bytes"])
MAX_KEY_LENGTH = 200

Fingerprint = Tuple[str, str, int, int]


def applies(method: str, path: str) -> bool:
    """Whether a call to ``method path`` honours the key (reads and GETs need none)."""
    return method == "POST" and path not in READS


def fingerprint(method: str, path: str, body: bytes) -> Fingerprint:
    # hash() of bytes is a keyed 64-bit SipHash: enough to tell a retry from another
    # request in one process, without hashlib (which loads OpenSSL into an idle execd).
    return (method, path, len(body), hash(body))


def check_key(key: str) -> str:
    if not 0 < len(key) <= MAX_KEY_LENGTH or not all(" " < c <= "~" for c in key):
        raise ApiError(
            400,
            "bad_idempotency_key",
            "Idempotency-Key must be 1-%d printable ASCII characters without spaces"
            % MAX_KEY_LENGTH,
        )
    return key


def claim(
    table: "KeyTable",
    key: Optional[str],
    request: Tuple[str, str, bytes],
    stopping: Callable[[], bool],
) -> "Union[None, Ticket, Recorded]":
    """For one request (method, path, raw body): None when no key applies, a ``Ticket``
    for the call that runs, or the ``Recorded`` answer of the call that ran."""
    method, path, body = request
    if key is None or not applies(method, path):
        return None
    return table.begin(key, fingerprint(method, path, body), stopping)


class Recorded(NamedTuple):
    """A settled call's answer: ``kind`` is ``json`` (a whole body) or ``stream`` (the
    final frame of a streamed call: its output frames are not kept)."""

    status: int
    kind: str
    body: bytes


class _Entry(object):
    def __init__(self, fp: Fingerprint) -> None:
        self.fp = fp
        self.answer = None  # type: Optional[Recorded]
        self.settled = threading.Event()
        self.expires = 0.0


class Ticket(object):
    """The claim of a key by the call that runs it."""

    def __init__(self, table: "KeyTable", key: str, entry: _Entry) -> None:
        self._table = table
        self._key = key
        self._entry = entry
        self.settled = False

    def finish(self, answer: Recorded) -> None:
        if not self.settled:
            self.settled = True
            self._table._settle(self._key, self._entry, answer)

    def abandon(self) -> None:
        if not self.settled:
            self.settled = True
            self._table._settle(self._key, self._entry, None)


class KeyTable:
    def __init__(
        self,
        max_keys: int = 1024,
        ttl_s: float = 600.0,
        max_bytes: int = 64 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_keys = max_keys
        self.ttl_s = ttl_s
        self.max_bytes = max_bytes
        self.clock = clock
        self._lock = threading.Lock()
        self._entries = OrderedDict()  # type: OrderedDict[str, _Entry]
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def begin(
        self, key: str, fp: Fingerprint, stopping: Callable[[], bool] = lambda: False
    ) -> Union[Ticket, Recorded]:
        """Claim ``key`` (a ``Ticket``), or the recorded answer of the call that did."""
        check_key(key)
        while True:
            with self._lock:
                self._expire()
                entry = self._entries.get(key)
                if entry is None:
                    return Ticket(self, key, self._add(key, fp))
                if entry.fp != fp:
                    raise ApiError(
                        422,
                        "idempotency_key_reused",
                        "this Idempotency-Key was sent with another request; use a new key "
                        "per call",
                    )
                if entry.answer is not None:
                    return entry.answer
            # The first call still runs: wait for it (its own timeout bounds it).
            while not entry.settled.wait(1.0):
                if stopping():
                    raise ApiError(409, "busy", "execd is stopping")
            if entry.answer is not None:
                return entry.answer
            # it was refused (nothing ran): claim the key afresh

    def _add(self, key: str, fp: Fingerprint) -> _Entry:
        if len(self._entries) >= self.max_keys:
            done = [k for k, e in self._entries.items() if e.answer is not None]
            if not done:
                raise ApiError(
                    429,
                    "too_many_keys",
                    "%d calls with an Idempotency-Key are still running" % len(self._entries),
                )
            self._drop(done[0])
        entry = _Entry(fp)
        self._entries[key] = entry
        return entry

    def _settle(self, key: str, entry: _Entry, answer: Optional[Recorded]) -> None:
        with self._lock:
            if answer is None or len(answer.body) > self.max_bytes:
                if self._entries.get(key) is entry:
                    del self._entries[key]
            else:
                entry.answer = answer
                entry.expires = self.clock() + self.ttl_s
                self._bytes += len(answer.body)
                self._entries.move_to_end(key)
                while self._bytes > self.max_bytes:
                    oldest = next(k for k, e in self._entries.items() if e.answer is not None)
                    self._drop(oldest)
        entry.settled.set()

    def _expire(self) -> None:
        # Settled entries sit in the order they settled (move_to_end), so in expiry order:
        # stop at the first one still fresh.
        now = self.clock()
        gone = []
        for k, e in self._entries.items():
            if e.answer is None:
                continue
            if e.expires > now:
                break
            gone.append(k)
        for k in gone:
            self._drop(k)

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key)
        if entry.answer is not None:
            self._bytes -= len(entry.answer.body)
