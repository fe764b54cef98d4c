"""The wire shapes of background commands (issue 14 item 4; ``background.py``) and the
template of their ``/exec/{id}`` paths. Part of ``protocol`` (which re-exports every name
here and lists the routes in ``ROUTES``); kept apart only to keep that module short. Same
rules: Python 3.8, standard library only, ``from_json`` never guesses.
"""

from typing import Any, Dict, NamedTuple, Optional, Union

from .shapes import answer, as_json

Json = Dict[str, Any]
_json = as_json


class BackgroundHandle(NamedTuple):
    """``POST /exec`` with ``background: true`` answers this instead of an ExecAnswer."""

    id: str
    pid: int
    background: bool = True

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "BackgroundHandle":
        return answer(cls, "POST /exec (background)", obj)


class BackgroundStatus(NamedTuple):
    """``GET /exec/{id}?offset=N&max_bytes=M``: ``output`` holds the kept bytes ``offset``
    to ``next_offset`` (UTF-8; a character the window cuts waits for the next poll);
    ``exit_code`` is None while ``running``; ``signal`` is the one that ended it."""

    id: str
    pid: int
    running: bool
    timed_out: bool
    output: str
    offset: int
    next_offset: int
    output_bytes: int
    dropped_bytes: int
    duration_ms: float
    exit_code: Optional[int] = None  # absent while running
    signal: Optional[int] = None

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "BackgroundStatus":
        return answer(cls, "GET /exec/{id}", obj)


class SignalRequest(NamedTuple):
    """A name (``INT``, ``SIGTERM``) or a number; sent to the command's process group."""

    signal: Union[str, int] = "TERM"

    def to_json(self) -> Json:
        return _json(self)


class SignalAnswer(NamedTuple):
    id: str
    signal: int
    pid: int

    def to_json(self) -> Json:
        return _json(self)

    @classmethod
    def from_json(cls, obj: Any) -> "SignalAnswer":
        return answer(cls, "POST /exec/{id}/signal", obj)
