"""The shapes of the session routes (``execd/sessions.py``): part of ``protocol``, which
re-exports every name here and lists the routes in ``protocol.ROUTES``; the same rules
hold (``from_json`` never guesses; Python 3.8, standard library only).
"""

from typing import Any, Dict, List, NamedTuple, Optional

from .shapes import answer, as_json

Json = Dict[str, Any]
_json = as_json


class SessionRequest(NamedTuple):
    """``POST /sessions``: a new named shell; ``startup`` runs in it first (and again in
    every shell the session restarts), after the sandbox's own startup script."""

    name: str
    startup: Optional[str] = None
    startup_timeout_s: Optional[float] = None

    def to_json(self) -> Json:
        return _json(self)


class SessionAnswer(NamedTuple):
    """One session: its shell's pid (None while it has none), whether a command runs,
    and the startup script's answer when the session was just created with one."""

    name: str
    pid: Optional[int]
    alive: bool
    busy: bool
    startup: Optional[Dict[str, Any]] = None  # an ExecAnswer object

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "SessionAnswer":
        return answer(cls, "POST /sessions", obj)


class SessionsAnswer(NamedTuple):
    """``GET /sessions``: every session, ``default`` first (objects of SessionAnswer's
    fields)."""

    sessions: List[Dict[str, Any]]

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "SessionsAnswer":
        route = "GET /sessions"
        shape = answer(cls, route, obj)
        for item in shape.sessions:
            SessionAnswer.from_json(item)
        return shape


class InterruptAnswer(NamedTuple):
    """``interrupted``: a command was running and got the interrupt; ``pgid``: the
    process group sent SIGINT (0: the shell was running a builtin, unwound instead)."""

    session: str
    interrupted: bool
    pgid: Optional[int] = None

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "InterruptAnswer":
        return answer(cls, "POST /sessions/{name}/interrupt", obj)


class DeletedAnswer(NamedTuple):
    """``DELETE /sessions/{name}``: the processes of the session that were killed."""

    session: str
    killed: List[int]

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "DeletedAnswer":
        return answer(cls, "DELETE /sessions/{name}", obj)
