"""Exit-status frames, the capped output buffer and the syntax-check wrapper.

Pure logic, no I/O, so each piece is testable on its own (Table A25).

Invariants:
- A status frame is accepted only as ``<marker> <kind> <status>\\n`` where
  marker is this command's random marker, kind one of ``x`` (ran), ``s``
  (refused by the syntax check) or ``c`` (cd to the requested cwd failed),
  and status a terminated decimal 0-255 without leading zeros. Anything
  else - empty, cut off, a foreign marker, trailing bytes - is an error, and
  the caller must restart the shell: its state can no longer be trusted.
- The output buffer never holds more than ``cap`` bytes however much is fed.
"""

import re
from typing import NamedTuple, Optional, Union

_FRAME = re.compile(rb"\A([0-9a-f]{16}) ([xsc]) (0|[1-9][0-9]{0,2})\n\Z")


class Frame(NamedTuple):
    kind: str
    status: int


class FrameError(Exception):
    """The status channel carried something that is not exactly one valid frame."""


class FrameParser:
    """Accumulates bytes from the status channel, across any number of reads."""

    def __init__(self, marker: str) -> None:
        self.marker = marker.encode("ascii")
        self.buf = b""

    def feed(self, data: bytes) -> Optional[Frame]:
        """Returns the frame once its newline arrived; raises FrameError if invalid."""
        self.buf += data
        end = self.buf.find(b"\n")
        if end < 0:
            if len(self.buf) > 64:
                raise FrameError("status frame longer than any valid frame")
            return None
        if end + 1 != len(self.buf):
            raise FrameError("bytes after the status frame")
        m = _FRAME.match(self.buf)
        if m is None:
            raise FrameError("malformed status frame %r" % self.buf[:80])
        if m.group(1) != self.marker:
            raise FrameError("status frame carries a foreign marker")
        status = int(m.group(3))
        if status > 255:
            raise FrameError("status %d is outside 0-255" % status)
        return Frame(m.group(2).decode(), status)

    def describe_incomplete(self) -> str:
        if not self.buf:
            return "no status frame"
        if not self.buf.startswith(self.marker):
            return "garbled status frame"
        return "incomplete status frame %r" % self.buf.decode("ascii", "replace")


class OutputCapture:
    """Keeps the head and the tail of a stream, at most ``cap`` bytes in all. (It holds
    nothing for a socket, so ``due`` stays None and ``flush`` does nothing.)"""

    due = None  # type: Optional[float]

    def flush(self) -> None:
        pass

    def __init__(self, cap: int) -> None:
        self.head_cap = cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, chunk: Union[bytes, bytearray, memoryview]) -> None:
        n = len(chunk)
        self.total += n
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if not len(chunk):
            return
        if len(chunk) >= self.tail_cap:
            self.tail = bytearray(chunk[len(chunk) - self.tail_cap :])
            return
        self.tail += chunk
        excess = len(self.tail) - self.tail_cap
        if excess > 0:
            del self.tail[:excess]

    @property
    def dropped(self) -> int:
        return self.total - len(self.head) - len(self.tail)

    def text(self) -> str:
        if self.dropped:
            note = "\n[... execd dropped %d bytes of output here ...]\n" % self.dropped
            data = bytes(self.head) + note.encode() + bytes(self.tail)
        else:
            data = bytes(self.head) + bytes(self.tail)
        return data.decode("utf-8", "replace")


def check_wrapper(command: str) -> str:
    """The text the shell parses, never runs, before it runs ``command``.

    ``if ((0))`` is an arithmetic command (no function or builtin a user could
    redefine); bash parses the whole compound before running any of it, so any
    syntax error - an open quote, a missing ``fi`` - fails the parse and
    nothing executes. The subshell-in-a-function-in-an-if nesting means that a
    stray closer in the command (``)``, ``}`` or ``fi``) is itself a syntax
    error rather than an escape to top level. An unterminated heredoc swallows
    the closing lines, so it, too, becomes ``unexpected end of file``. The
    command starts on line 1 so bash's line numbers are the user's.
    """
    return "if ((0)); then __sandman_parse_only() ( : ; " + command + "\n); fi\n"
