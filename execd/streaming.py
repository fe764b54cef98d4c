"""Streamed ``/exec`` answers (``stream: true``): the frame codec both sides share, the
daemon's chunked writer and the capture that forwards output as it is drained.

The answer is HTTP/1.1 ``200`` with ``Transfer-Encoding: chunked`` and ``Content-Type:
application/vnd.sandman.exec-stream``; its body is a sequence of frames, each
``<kind> <length>\\n<length bytes>``:

* ``o``: output bytes, in the order the command wrote them (stdout and stderr joined;
  with ``stderr: "separate"`` stdout only);
* ``s``: stderr bytes, only with ``stderr: "separate"`` (so a client that never asks for
  it never meets this kind); stderr has a cap of its own, as in a plain call;
* ``x``: the final frame, once: the call's ``ExecAnswer`` as JSON (``output`` holds what
  was not streamed - a syntax error's diagnostic - and ``output_bytes``,
  ``dropped_bytes`` and ``truncated`` count the whole output; ``stderr`` is then empty
  but for what was not streamed, ``stderr_bytes`` counts the whole stderr);
* ``e``: a final error frame ``{error, detail}`` when the daemon failed after the
  answer had begun (a 500 can no longer be sent).

Invariants a reader must not break:
* The output cap still applies: at most ``cap`` bytes are streamed (the head); the
  rest is drained, counted in ``dropped_bytes`` and never sent. Nothing is buffered for
  the final frame, so a 100 MiB stream costs the daemon one read buffer, not 100 MiB.
* The decoder is strict, like the status-frame parser: a malformed header, a frame of an
  unknown kind, bytes after the final frame, or a body that ends without one is a
  ``StreamError`` - a client never guesses an exit status from a cut-off stream.
* A refusal decided before the command starts (400, 409 ``busy``) is a plain JSON
  answer: the chunked head is written only with the first frame.
* Python 3.8, standard library only (this file runs inside the sandbox's ``python3``).
"""

import json
import logging
import re
import time
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple, Union

from .frames import OutputCapture
from .idempotency import REPLAYED, Recorded, Ticket
from .protocol import ErrorAnswer
from .wire import ApiError

log = logging.getLogger("execd.streaming")

CONTENT_TYPE = "application/vnd.sandman.exec-stream"
OUTPUT, STDERR, FINAL, ERROR = "o", "s", "x", "e"
DATA = (OUTPUT, STDERR)  # the kinds that carry command output; the others end a stream
MAX_FINAL_BYTES = 64 << 20  # a final frame is JSON of a capped answer
MAX_OUTPUT_FRAME = 16 << 20  # the daemon sends at most one 1 MiB read per frame

_HEAD = re.compile(rb"([osxe]) (0|[1-9][0-9]{0,9})\n")  # matched at a frame's start
_KINDS = {k.encode(): k for k in (OUTPUT, STDERR, FINAL, ERROR)}
Chunk = Union[bytes, bytearray, memoryview]
HOLD_S = 0.002  # output frames wait this long for more output or the final frame
HOLD_BYTES = 64 << 10  # ... or until this much is held
SMALL_WRITE = 16 << 10  # a socket write up to this size is one joined buffer


class StreamError(Exception):
    """The stream is not a valid sequence of frames ending in exactly one final frame."""


def frame(kind: str, payload: Chunk) -> bytes:
    return b"%s %d\n" % (kind.encode("ascii"), len(payload)) + bytes(payload)


def final_frame(answer: Dict[str, Any]) -> bytes:
    return frame(FINAL, json.dumps(answer).encode())


def error_frame(error: Dict[str, Any]) -> bytes:
    return frame(ERROR, json.dumps(error).encode())


class Event(NamedTuple):
    kind: str  # OUTPUT, STDERR, FINAL or ERROR
    data: bytes  # output (or stderr) bytes, or the final frame's JSON text

    def json(self) -> Any:
        return json.loads(self.data)


class StreamDecoder:
    """Accumulates the body's bytes across any number of reads; yields whole frames.
    A payload inside one read costs one copy (its slice); only a header split across two
    reads is joined."""

    def __init__(self) -> None:
        self._head = b""  # a header cut by the end of a read
        self._need = None  # type: Optional[int]
        self._kind = ""
        self._parts = []  # type: List[bytes]
        self.finished = False

    def feed(self, data: Chunk) -> List[Event]:
        if type(data) is not bytes:
            data = bytes(data)
        if self._head:
            data, self._head = self._head + data, b""
        events = []  # type: List[Event]
        pos, n = 0, len(data)
        while pos < n:
            if self.finished:
                raise StreamError("bytes after the final frame")
            if self._need is None:
                end = data.find(b"\n", pos, pos + 16)
                if end < 0:
                    if n - pos >= 16:
                        raise StreamError("malformed frame header %r" % data[pos : pos + 16])
                    self._head = data[pos:]
                    break
                m = _HEAD.match(data, pos, end + 1)
                if m is None:
                    raise StreamError("malformed frame header %r" % data[pos : end + 1])
                kind, need = _KINDS[m.group(1)], int(m.group(2))
                if need > (MAX_OUTPUT_FRAME if kind in DATA else MAX_FINAL_BYTES):
                    raise StreamError("a %r frame of %d bytes is too long" % (kind, need))
                pos = end + 1
                if need <= n - pos:  # the whole frame is in this read: no parts to join
                    events.append(Event(kind, data[pos : pos + need]))
                    pos += need
                    self.finished = kind not in DATA
                    continue
                self._kind, self._need = kind, need
            take = min(self._need, n - pos)
            if take:
                self._parts.append(data if take == n else data[pos : pos + take])
                pos += take
                self._need -= take
            if self._need == 0:
                parts, self._parts = self._parts, []
                payload = parts[0] if len(parts) == 1 else b"".join(parts)
                events.append(Event(self._kind, payload))
                self._need = None
                self.finished = self._kind not in DATA
        return events

    def close(self) -> None:
        """The body ended: raises unless it ended right after the final frame."""
        if not self.finished or self._head:
            raise StreamError("the stream ended without its final frame")


def decode(chunks: Iterator[bytes]) -> Iterator[Event]:
    """Every frame of a body read in ``chunks``, checked to the end."""
    decoder = StreamDecoder()
    for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event
    decoder.close()


# -- the daemon's side ----------------------------------------------------------------------


class StreamCapture:
    """What ``Shell`` feeds output to in stream mode: the first ``cap`` bytes go to
    ``sink`` as frames of ``kind`` (``o``; ``s`` for a separate stderr) as they are read,
    the rest is only counted. Reads the same as ``frames.OutputCapture`` for the final
    answer (``text`` is empty: it was sent).

    Frames are held for at most ``HOLD_S`` (or ``HOLD_BYTES``) before they are written, so
    a short command's output leaves in the same socket write (and client read) as its
    final frame instead of one write and wake-up each; a longer one still streams. The
    hold is the sink's: stdout and stderr captures of one call share it (``due``)."""

    def __init__(
        self,
        cap: int,
        sink: "Sink",
        scrub: Callable[[Chunk], Chunk],
        clock: Callable[[], float] = time.monotonic,
        kind: str = OUTPUT,
    ) -> None:
        self.cap = cap
        self.sink = sink
        self.scrub = scrub
        self.clock = clock
        self.total = 0
        self.sent = 0
        self._head = kind.encode("ascii") + b" %d\n"

    @property
    def due(self) -> Optional[float]:
        """When the sink's held frames must go out (None: nothing is held)."""
        return self.sink.due

    def feed(self, chunk: Chunk) -> None:
        n = len(chunk)
        self.total += n
        room = self.cap - self.sent
        if room <= 0 or not n:
            return
        part = chunk[:room] if n > room else chunk
        self.sent += len(part)
        sink = self.sink
        sink.send([self._head % len(part), self.scrub(part)])
        if sink.held >= HOLD_BYTES:
            sink.flush()
        elif sink.due is None:
            sink.due = self.clock() + HOLD_S

    def flush(self) -> None:
        """Send the held frames (``Shell`` calls it once ``due`` has passed)."""
        self.sink.flush()

    @property
    def dropped(self) -> int:
        return self.total - self.sent

    def text(self) -> str:
        return ""


def captures_for(
    cap: int,
    sink: "Optional[Sink]",
    scrub: Callable[[Chunk], Chunk],
    clock: Callable[[], float],
    separate_stderr: bool = False,
) -> Tuple[Any, Any]:
    """One command's output capture and its stderr capture (None unless
    ``separate_stderr``), each under ``cap``: streamed (``o`` and ``s`` frames) when a sink
    is given, else head + tail."""
    if sink is None:
        return OutputCapture(cap), OutputCapture(cap) if separate_stderr else None
    errors = StreamCapture(cap, sink, scrub, clock, STDERR) if separate_stderr else None
    return StreamCapture(cap, sink, scrub, clock), errors


class Streamed(NamedTuple):
    """What ``App.exec`` returns for ``stream: true``: ``run(sink)`` runs the command,
    sending ``o`` frames through ``sink``, and returns the final answer's JSON."""

    run: Callable[["Sink"], Dict[str, Any]]


def send_all(sock: Any, parts: List[Chunk]) -> None:
    """``sendall`` of several buffers in one ``sendmsg`` where the kernel takes them all
    (no joined copy of a 1 MiB output chunk); a small answer is joined (one copy is
    cheaper than a view per buffer)."""
    if sum(len(p) for p in parts) <= SMALL_WRITE:
        sock.sendall(b"".join(parts))
        return
    views = [memoryview(p).cast("B") for p in parts if len(p)]
    while views:
        sent = sock.sendmsg(views)
        while sent:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0], sent = views[0][sent:], 0


class ChunkedAnswer:
    """A ``200`` stream answer written through ``write`` (``send_all`` on the connection's
    socket); the head goes out with the first write, so a refusal before any frame is
    still plain JSON. Frames ``send`` gives are held until ``flush`` or ``finish``, which
    write all held frames as one HTTP chunk in one socket write (``finish`` with the final
    frame and the chunked terminator). Always chunked, even when the whole answer is
    ready at its first write: a ``Content-Length`` body would spare the client's chunk
    parsing (~2 us), but http.client's ``read1`` never marks such a response finished
    (it stops at length 0 without closing), so a client's ``read1`` loop - the way to
    read a stream as it comes - would leave its keep-alive connection unusable."""

    def __init__(
        self,
        write: Callable[[List[Chunk]], Any],
        close_connection: bool,
        headers: Tuple[str, ...] = (),
    ) -> None:
        self._write = write
        self._close = close_connection
        self._headers = headers
        self._head_sent = False
        self._held = []  # type: List[Chunk]
        self.held = 0  # bytes in _held
        self.due = None  # type: Optional[float]  # when the held frames must go out
        self.started = False  # a frame was given: an error now ends the stream as an ``e``
        self.broken = False  # the client went away: the command still runs to its end
        self.sent_bytes = 0

    def _head(self) -> bytes:
        # (no Cache-Control: caches do not store an answer to a POST without explicit
        # freshness, RFC 9111 section 3, and each header costs every client a parse)
        lines = ["HTTP/1.1 200 OK", "Content-Type: " + CONTENT_TYPE, "Transfer-Encoding: chunked"]
        lines += self._headers
        if self._close:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    def send(self, frame_parts: List[Chunk]) -> None:
        """One frame, given as buffers, held for the next write."""
        self.started = True
        self._held += frame_parts
        for p in frame_parts:
            self.held += len(p)

    def flush(self, last: bool = False) -> None:
        """Write the held frames as one HTTP chunk (``last``: then the terminator) in one
        socket write. A failed write drops this and every later frame instead of raising
        into the shell's drain loop: the command finishes as it would for a client that
        hung up on a plain call."""
        parts, size = self._held, self.held
        self._held, self.held, self.due = [], 0, None
        if not size and not last:
            return
        parts = ([b"%x\r\n" % size] + parts + [b"\r\n"]) if size else []
        if last:
            parts.append(b"0\r\n\r\n")
        if not self._head_sent:
            parts.insert(0, self._head())
            self._head_sent = True
        self.sent_bytes += size
        if self.broken:
            return
        try:
            self._write(parts)
        except OSError:
            self.broken = True

    def finish(self, last_frame: bytes) -> None:
        self.send([last_frame])
        self.flush(last=True)


Sink = ChunkedAnswer  # what a streamed command's output frames go to


def respond(
    streamed: Streamed,
    sock: Any,
    close_connection: bool,
    ticket: Optional[Ticket],
) -> ChunkedAnswer:
    """Run a ``stream: true`` call and answer it. An error before the first frame is
    raised (the server answers it as plain JSON); after it, it ends the stream as an ``e``
    frame. A ``ticket`` (Idempotency-Key) records the last frame before it is sent."""
    out = ChunkedAnswer(lambda parts: send_all(sock, parts), close_connection)
    try:
        answer = streamed.run(out)
    except ApiError as e:
        if not out.started:
            raise
        last = error_frame(e.body())
    except Exception as e:
        if not out.started:
            raise
        log.exception("streamed /exec failed")
        last = error_frame(ErrorAnswer("internal", "%s: %s" % (type(e).__name__, e)).to_json())
    else:
        last = final_frame(answer)
    if ticket is not None:
        ticket.finish(Recorded(200, "stream", last))
    out.finish(last)
    return out


def replay(sock: Any, close_connection: bool, last_frame: bytes) -> int:
    """A retried streamed call's recorded answer: only its final frame (the output frames
    went to the first call's connection and are not kept)."""
    out = ChunkedAnswer(
        lambda parts: send_all(sock, parts), close_connection, (REPLAYED + ": true",)
    )
    out.finish(last_frame)
    return out.sent_bytes
