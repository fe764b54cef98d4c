"""execd's wire protocol: the request and answer shape of every route, and the error shape.

The daemon builds every answer through these shapes (``to_json``) and parses every request
body into them (``wire.parse``); clients build requests with ``to_json`` and read answers
with ``from_json``. One module for both sides, so the daemon and its clients cannot drift.

Rules a reader must not break:
* ``from_json`` never guesses: a missing field, a field of the wrong type or an answer that
  is not a JSON object raises ``ProtocolError`` naming the route and the field. Fields an
  answer does not declare are ignored (a newer execd may add one); renaming or removing a
  field, or changing its type, is a protocol change on both sides.
* Every error answer is ``{"error": code, "detail": sentence, ...extra}`` (``ErrorAnswer``;
  the daemon raises it as ``wire.ApiError``).
* Python 3.8, standard library only: this file runs inside the sandbox's own ``python3``.
  Shapes are ``typing.NamedTuple`` classes - immutable and typed like frozen dataclasses,
  but ``dataclasses`` imports ``inspect``, which costs an idle execd ~1 MiB of RSS.
"""

from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Union

from .background_protocol import BackgroundHandle as BackgroundHandle
from .background_protocol import BackgroundStatus as BackgroundStatus
from .background_protocol import SignalAnswer as SignalAnswer
from .background_protocol import SignalRequest as SignalRequest
from .protocol_sessions import DeletedAnswer as DeletedAnswer
from .protocol_sessions import InterruptAnswer as InterruptAnswer
from .protocol_sessions import SessionAnswer as SessionAnswer
from .protocol_sessions import SessionRequest as SessionRequest
from .protocol_sessions import SessionsAnswer as SessionsAnswer
from .shapes import ProtocolError as ProtocolError  # clients catch it from here
from .shapes import answer, as_json

Json = Dict[str, Any]
_json = as_json

# -- requests (``wire`` adds the daemon's checks of the values: 400 ``bad_value``) ---------


class ExecRequest(NamedTuple):
    """``cwd`` applies to this call only (the shell's own directory is kept); ``isolate``
    runs the command in a subshell that sees the shell's state but cannot change it;
    ``max_output_bytes`` caps this call's output (at most execd's --max-output-bytes)."""

    command: str
    timeout_s: Optional[float] = None
    cwd: Optional[str] = None
    test_hooks: Optional[Dict[str, Any]] = None
    isolate: Optional[bool] = None
    max_output_bytes: Optional[int] = None
    # issue 14 item 4: ``stream`` answers in frames (execd/streaming.py); ``background``
    # starts the command beside the shell and answers a handle (execd/background.py).
    stream: Optional[bool] = None
    background: Optional[bool] = None
    # sessions (execd/sessions.py): the named shell to run in (None: "default"), and
    # "merged" (None: stderr joined to stdout) or "separate" (ExecAnswer.stderr)
    session: Optional[str] = None
    stderr: Optional[str] = None

    def to_json(self) -> Json:
        return _json(self)


class ReadRequest(NamedTuple):
    path: str
    start_line: int = 1
    max_lines: Optional[int] = None

    def to_json(self) -> Json:
        return _json(self)


class ReadBytesRequest(NamedTuple):
    """``length`` bytes from ``offset`` (to the end of the file when None)."""

    path: str
    offset: int = 0
    length: Optional[int] = None

    def to_json(self) -> Json:
        return _json(self)


class WriteRequest(NamedTuple):
    path: str
    content: Optional[str] = None
    content_b64: Optional[str] = None
    expected_sha256: Optional[str] = None
    mode: Optional[Union[int, str]] = None
    make_parents: bool = False

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def of(cls, path: str, content: Union[str, bytes], *rest: Any) -> "WriteRequest":
        """Text as ``content``, bytes as ``content_b64`` (exact bytes, any encoding);
        ``rest`` is expected_sha256, mode, make_parents."""
        if isinstance(content, str):
            return cls(path, content, None, *rest)
        import base64  # here: clients build writes; the daemon never does

        return cls(path, None, base64.b64encode(content).decode("ascii"), *rest)


class EnvRequest(NamedTuple):
    set: Dict[str, str] = {}  # never mutated: requests are read-only
    unset: List[str] = []

    def to_json(self) -> Json:
        return _json(self)


class StateRequest(NamedTuple):
    """The body of all three /state routes (check and restore use the baseline's spec)."""

    repos: Optional[List[str]] = None
    roots: Optional[List[str]] = None
    site_packages: Optional[List[str]] = None
    max_copy_bytes: Optional[int] = None
    copy_budget_bytes: Optional[int] = None

    def to_json(self) -> Json:
        return _json(self)


# -- answers ------------------------------------------------------------------------------


class ErrorAnswer(NamedTuple):
    """Every non-200 answer; ``extra`` holds route-specific keys (``use``, ``current_sha256``)."""

    error: str
    detail: str
    extra: Dict[str, Any] = {}

    def to_json(self) -> Json:
        out = {"error": self.error, "detail": self.detail}  # type: Json
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, obj: Any, route: str = "error") -> "ErrorAnswer":
        base = answer(_ErrorFields, route, obj)
        extra = {k: v for k, v in obj.items() if k not in ("error", "detail")}
        return cls(base.error, base.detail, extra)


class _ErrorFields(NamedTuple):
    error: str
    detail: str


class HealthAnswer(NamedTuple):
    ok: bool
    version: str
    shell_alive: bool

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "HealthAnswer":
        return answer(cls, "GET /health", obj)


class ExecAnswer(NamedTuple):
    """``error`` (absent when None) says why the shell could not give a clean status, and
    ``error_code`` (absent when None) is the same for machines: one of ``ERROR_CODES``.
    ``timed_out`` is true only for execd's own timeout, never for a command's exit 124."""

    exit_code: int
    output: str
    output_bytes: int
    truncated: bool
    dropped_bytes: int
    duration_ms: float
    shell_restarted: bool
    error: Optional[str] = None
    timed_out: bool = False
    error_code: Optional[str] = None
    # only with ``stderr: "separate"``: stderr (capped like ``output``) and its byte count
    stderr: Optional[str] = None
    stderr_bytes: Optional[int] = None

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "ExecAnswer":
        return answer(cls, "POST /exec", obj)


# ExecAnswer.error_code values: execd's timeout; bash refused the syntax (nothing ran); the
# call's cwd could not be entered; the shell exited or was killed during the command; the
# status channel carried an invalid frame; /reset or execd's shutdown cut the command short.
ERROR_CODES = (
    "timeout",
    "syntax_error",
    "cwd_failed",
    "shell_died",
    "invalid_frame",
    "reset",
    "stopping",
    "interrupted",  # POST /sessions/{name}/interrupt (SIGINT to the foreground job)
    "session_closed",  # DELETE /sessions/{name} while the command ran
)


class ReadAnswer(NamedTuple):
    """A text window; ``size`` and ``sha256`` describe the WHOLE file."""

    path: str
    content: str
    start_line: int
    end_line: int
    total_lines: int
    complete: bool
    size: int
    sha256: str
    line_endings: str  # lf | crlf | mixed | none
    bare_cr: bool
    bom: bool

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "ReadAnswer":
        return answer(cls, "POST /files/read", obj)


class ReadBytesAnswer(NamedTuple):
    """The bytes from ``offset``; ``size`` and ``sha256`` describe the WHOLE file, and
    ``complete`` says the answer holds all of it."""

    path: str
    content_b64: str
    size: int
    sha256: str
    offset: int = 0
    complete: bool = True

    def data(self) -> bytes:
        """The file's exact bytes."""
        import base64  # here: the daemon only ever encodes

        try:
            return base64.b64decode(self.content_b64, validate=True)
        except ValueError:  # binascii.Error
            route = "POST /files/read_bytes"
            raise ProtocolError(route, "content_b64", "content_b64 is not base64") from None

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "ReadBytesAnswer":
        return answer(cls, "POST /files/read_bytes", obj)


class WriteAnswer(NamedTuple):
    path: str
    size: int
    sha256: str

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "WriteAnswer":
        return answer(cls, "POST /files/write", obj)


class EnvAnswer(NamedTuple):
    """The persistent shell's exported environment (both GET and POST /env)."""

    env: Dict[str, str]

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "EnvAnswer":
        return answer(cls, "/env", obj)


class ResetAnswer(NamedTuple):
    killed: List[int]
    survivors: List[int]
    shell_alive: bool
    duration_ms: float

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "ResetAnswer":
        return answer(cls, "POST /reset", obj)


class BaselineAnswer(NamedTuple):
    repos: List[str]
    roots: List[str]
    site_packages: List[str]
    files: int
    restorable_files: int
    copied_bytes: int
    processes: int
    truncated: List[str]  # trees cut short by the copy budget
    duration_ms: float

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "BaselineAnswer":
        return answer(cls, "POST /state/baseline", obj)


class CheckAnswer(NamedTuple):
    """``differences``: objects with ``kind`` and ``change`` plus kind-specific keys."""

    clean: bool
    differences: List[Dict[str, Any]]
    duration_ms: float

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "CheckAnswer":
        return answer(cls, "POST /state/check", obj)


class RestoreAnswer(NamedTuple):
    """What was undone, what could not be (with ``reason``), and the check afterwards."""

    restored: List[Dict[str, Any]]
    unrestorable: List[Dict[str, Any]]
    clean: bool
    remaining: List[Dict[str, Any]]
    duration_ms: float

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "RestoreAnswer":
        return answer(cls, "POST /state/restore", obj)


class ProbeAnswer(NamedTuple):
    """Each reading is ``{"value": ..., "source": str}`` or ``{"unreadable": str}``."""

    readings: Dict[str, Dict[str, Any]]

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "ProbeAnswer":
        route = "GET /probe"
        shape = answer(cls, route, obj)
        for name, reading in shape.readings.items():
            ok_value = isinstance(reading.get("source"), str) and "value" in reading
            if not ok_value and not isinstance(reading.get("unreadable"), str):
                why = "needs value and source, or unreadable"
                raise ProtocolError(route, "readings." + name, "readings.%s %s" % (name, why))
        return shape


class Route(NamedTuple):
    request: Optional[type]  # None: the route takes no body (an empty body or {} is accepted)
    answer: Any  # the answer shape (a class with ``from_json``)
    auth: bool = True  # Authorization: Bearer <token> required, else 401


ROUTES: Dict[Tuple[str, str], Route] = {
    ("GET", "/health"): Route(None, HealthAnswer, auth=False),
    ("POST", "/exec"): Route(ExecRequest, ExecAnswer),
    ("POST", "/files/read"): Route(ReadRequest, ReadAnswer),
    ("POST", "/files/read_bytes"): Route(ReadBytesRequest, ReadBytesAnswer),
    ("POST", "/files/write"): Route(WriteRequest, WriteAnswer),
    ("GET", "/env"): Route(None, EnvAnswer),
    ("POST", "/env"): Route(EnvRequest, EnvAnswer),
    ("POST", "/reset"): Route(None, ResetAnswer),
    ("POST", "/state/baseline"): Route(StateRequest, BaselineAnswer),
    ("POST", "/state/check"): Route(StateRequest, CheckAnswer),
    ("POST", "/state/restore"): Route(StateRequest, RestoreAnswer),
    ("GET", "/probe"): Route(None, ProbeAnswer),
    ("GET", "/exec/{id}"): Route(None, BackgroundStatus),
    ("POST", "/exec/{id}/signal"): Route(SignalRequest, SignalAnswer),
    # sessions (execd/sessions.py); ``{name}`` is a path segment
    ("POST", "/sessions"): Route(SessionRequest, SessionAnswer),
    ("GET", "/sessions"): Route(None, SessionsAnswer),
    ("DELETE", "/sessions/{name}"): Route(None, DeletedAnswer),
    ("POST", "/sessions/{name}/interrupt"): Route(None, InterruptAnswer),
}
