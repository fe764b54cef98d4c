"""The daemon's side of the wire: request parsing and value checks, and the one error type.

A JSON body becomes a ``protocol`` request shape (shared with the clients) through
``parse``, which then runs the route's value checks. Every error any route returns is an
``ApiError`` rendered as ``protocol.ErrorAnswer`` ``{"error": "<code>", "detail":
"<sentence>"}`` by the server's single send helper. Validation happens here, before any
handler touches the shell or the file system, so a malformed request can never change
sandbox state.

Invariant: ``parse`` rejects unknown fields and wrong types loudly (400 ``unknown_field`` /
``bad_type``) instead of coercing; ``bool`` is not accepted where a number is expected.
"""

import os
from typing import Any, Callable, Dict, Optional, Tuple, Type, TypeVar

from .protocol import (
    EnvRequest,
    ErrorAnswer,
    ExecRequest,
    ReadBytesRequest,
    ReadRequest,
    SessionRequest,
    WriteRequest,
)
from .shapes import FieldError, check

T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.extra = extra

    def body(self) -> Dict[str, Any]:
        return ErrorAnswer(self.code, self.detail, self.extra).to_json()


def parse(cls: Type[T], body: Any) -> T:
    """Build a request tuple from a decoded JSON body, or raise ApiError(400)."""
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "the request body must be a JSON object")
    kinds = cls.__annotations__
    defaults = cls._field_defaults  # type: ignore[attr-defined]
    values = {}
    for name in cls._fields:  # type: ignore[attr-defined]
        if name in body:
            try:
                values[name] = check(name, body[name], kinds[name])
            except FieldError as e:
                raise ApiError(400, "bad_type", e.sentence) from None
        elif name not in defaults:
            raise ApiError(400, "missing_field", "the field %r is required" % name)
    unknown = sorted(set(body) - set(kinds))
    if unknown:
        raise ApiError(400, "unknown_field", "unknown field(s): %s" % ", ".join(unknown))
    obj = cls(**values)
    validate = _VALIDATORS.get(cls)
    return validate(obj) if validate is not None else obj


def no_nul(name: str, value: str) -> None:
    if "\0" in value:
        raise ApiError(400, "bad_value", "%s must not contain NUL bytes" % name)


def resolve(workspace: str, path: str) -> str:
    """Relative paths resolve against the workspace; the result is absolute."""
    no_nul("path", path)
    if not path:
        raise ApiError(400, "bad_value", "path must not be empty")
    return os.path.normpath(os.path.join(workspace, os.path.expanduser(path)))


def _exec(req: ExecRequest) -> ExecRequest:
    no_nul("command", req.command)
    if req.timeout_s is not None and not (0 < req.timeout_s <= 7 * 86400):
        raise ApiError(400, "bad_value", "timeout_s must be > 0 and at most one week")
    if req.max_output_bytes is not None and req.max_output_bytes < 0:
        raise ApiError(400, "bad_value", "max_output_bytes must not be negative")
    if req.cwd is not None:
        no_nul("cwd", req.cwd)
        if "\n" in req.cwd:
            raise ApiError(400, "bad_value", "cwd must not contain a newline")
    if req.session is not None:
        session_name(req.session)
    if req.stderr not in (None, "merged", "separate"):
        raise ApiError(400, "bad_value", 'stderr is "merged" (the default) or "separate"')
    return req


SESSION_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def session_name(name: str) -> str:
    """A session name: 1-64 of ``[A-Za-z0-9_.-]``, or ApiError(400)."""
    if not 0 < len(name) <= 64 or not set(name) <= SESSION_NAME_CHARS or name in (".", ".."):
        raise ApiError(400, "bad_value", "a session name is 1-64 letters, digits, '_', '.' or '-'")
    return name


def _session(req: SessionRequest) -> SessionRequest:
    session_name(req.name)
    if req.startup is not None:
        no_nul("startup", req.startup)
    t = req.startup_timeout_s
    if t is not None and not (0 < t <= 7 * 86400):
        raise ApiError(400, "bad_value", "startup_timeout_s must be > 0 and at most one week")
    return req


def _read(req: ReadRequest) -> ReadRequest:
    if req.start_line < 1:
        raise ApiError(400, "bad_value", "start_line counts from 1")
    if req.max_lines is not None and req.max_lines < 0:
        raise ApiError(400, "bad_value", "max_lines must not be negative")
    return req


def _read_bytes(req: ReadBytesRequest) -> ReadBytesRequest:
    if req.offset < 0 or (req.length is not None and req.length < 0):
        raise ApiError(400, "bad_value", "offset and length must not be negative")
    return req


def _write(req: WriteRequest) -> WriteRequest:
    if (req.content is None) == (req.content_b64 is None):
        raise ApiError(400, "bad_request", "give exactly one of content and content_b64")
    if req.expected_sha256 is None:
        return req
    h = req.expected_sha256.lower()
    if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
        raise ApiError(400, "bad_value", "expected_sha256 must be 64 hex digits")
    return req._replace(expected_sha256=h)


def file_mode(req: WriteRequest) -> Optional[int]:
    """The write's ``mode`` as an int (octal text or a number), or None to keep the file's."""
    if req.mode is None:
        return None
    if isinstance(req.mode, str):
        try:
            mode = int(req.mode, 8)
        except ValueError:
            raise ApiError(400, "bad_value", 'mode must be octal digits like "0644"') from None
    else:
        mode = req.mode
    if not 0 <= mode <= 0o7777:
        raise ApiError(400, "bad_value", "mode must be between 0 and 07777")
    return mode


def _env(req: EnvRequest) -> EnvRequest:
    for name in list(req.set) + list(req.unset):
        if not _is_name(name):
            raise ApiError(400, "bad_value", "%r is not a shell variable name" % name)
        if name.startswith("SANDMAN_") or name.startswith("__sm_"):
            raise ApiError(400, "bad_value", "%s belongs to Sandman or execd" % name)
    for name, value in req.set.items():
        no_nul(name, value)
    return req


def _is_name(name: str) -> bool:
    return (
        bool(name)
        and (name[0].isalpha() or name[0] == "_")
        and all(c.isalnum() or c == "_" for c in name)
        and name.isascii()
    )


_VALIDATORS: Dict[type, Callable[[Any], Any]] = {
    ExecRequest: _exec,
    ReadRequest: _read,
    ReadBytesRequest: _read_bytes,
    WriteRequest: _write,
    EnvRequest: _env,
    SessionRequest: _session,
}


def split_hostport(text: str) -> Tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected HOST:PORT, got %r" % text)
    return host.strip("[]"), int(port)
