"""Wire shapes: request tuples, their validation, and the one error type.

Every error any route returns is an ``ApiError`` rendered as
``{"error": "<code>", "detail": "<sentence>"}`` by the server's single send
helper. Validation happens here, before any handler touches the shell or the
file system, so a malformed request can never change sandbox state.

Wire shapes are ``NamedTuple`` classes: typed and immutable, and lighter to
import than dataclasses, whose ``inspect`` dependency costs an idle execd ~1 MiB.

Invariant: ``parse`` rejects unknown types loudly (400 ``bad_type``) instead of
coercing; ``bool`` is not accepted where a number is expected.
"""

import os
from typing import Any, Dict, List, NamedTuple, Optional, Tuple, Type, TypeVar, Union

T = TypeVar("T")


class ApiError(Exception):
    def __init__(self, status: int, code: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.extra = extra

    def body(self) -> Dict[str, Any]:
        out = {"error": self.code, "detail": self.detail}  # type: Dict[str, Any]
        out.update(self.extra)
        return out


_NUMBER = (int, float)


def _check(name: str, value: Any, kind: Any) -> Any:
    """Return value if it has the declared type (Optional/List/Dict understood)."""
    origin = getattr(kind, "__origin__", None)
    args = getattr(kind, "__args__", ())
    if origin is Union:
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        for kind_option in inner[:-1]:
            try:
                return _check(name, value, kind_option)
            except ApiError:
                pass
        return _check(name, value, inner[-1])
    if origin in (list, List):
        if not isinstance(value, list):
            raise ApiError(400, "bad_type", "%s must be a list" % name)
        return [_check("%s[%d]" % (name, i), v, args[0]) for i, v in enumerate(value)]
    if origin in (dict, Dict):
        if not isinstance(value, dict):
            raise ApiError(400, "bad_type", "%s must be an object" % name)
        return {k: _check("%s.%s" % (name, k), v, args[1]) for k, v in value.items()}
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, _NUMBER):
            raise ApiError(400, "bad_type", "%s must be a number" % name)
        return float(value)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ApiError(400, "bad_type", "%s must be an integer" % name)
        return value
    if kind is bool:
        if not isinstance(value, bool):
            raise ApiError(400, "bad_type", "%s must be true or false" % name)
        return value
    if kind is str:
        if not isinstance(value, str):
            raise ApiError(400, "bad_type", "%s must be a string" % name)
        return value
    if kind is Any:
        return value
    raise TypeError("unsupported wire type %r" % (kind,))


def parse(cls: Type[T], body: Any) -> T:
    """Build a request tuple from a decoded JSON body, or raise ApiError(400)."""
    if not isinstance(body, dict):
        raise ApiError(400, "bad_request", "the request body must be a JSON object")
    kinds = cls.__annotations__
    defaults = cls._field_defaults
    values = {}
    for name in cls._fields:
        if name in body:
            values[name] = _check(name, body[name], kinds[name])
        elif name not in defaults:
            raise ApiError(400, "missing_field", "the field %r is required" % name)
    unknown = sorted(set(body) - set(kinds))
    if unknown:
        raise ApiError(400, "unknown_field", "unknown field(s): %s" % ", ".join(unknown))
    obj = cls(**values)  # type: ignore[call-arg]
    validate = getattr(obj, "validate", None)
    return validate() if validate is not None else obj


def no_nul(name: str, value: str) -> None:
    if "\0" in value:
        raise ApiError(400, "bad_value", "%s must not contain NUL bytes" % name)


def resolve(workspace: str, path: str) -> str:
    """Relative paths resolve against the workspace; the result is absolute."""
    no_nul("path", path)
    if not path:
        raise ApiError(400, "bad_value", "path must not be empty")
    return os.path.normpath(os.path.join(workspace, os.path.expanduser(path)))


class ExecRequest(NamedTuple):
    command: str
    timeout_s: Optional[float] = None
    cwd: Optional[str] = None
    test_hooks: Optional[Dict[str, Any]] = None

    def validate(self) -> "ExecRequest":
        no_nul("command", self.command)
        if self.timeout_s is not None and not (0 < self.timeout_s <= 7 * 86400):
            raise ApiError(400, "bad_value", "timeout_s must be > 0 and at most one week")
        if self.cwd is not None:
            no_nul("cwd", self.cwd)
            if "\n" in self.cwd:
                raise ApiError(400, "bad_value", "cwd must not contain a newline")
        return self


class ReadRequest(NamedTuple):
    path: str
    start_line: int = 1
    max_lines: Optional[int] = None

    def validate(self) -> "ReadRequest":
        if self.start_line < 1:
            raise ApiError(400, "bad_value", "start_line counts from 1")
        if self.max_lines is not None and self.max_lines < 0:
            raise ApiError(400, "bad_value", "max_lines must not be negative")
        return self


class ReadBytesRequest(NamedTuple):
    path: str


class WriteRequest(NamedTuple):
    path: str
    content: Optional[str] = None
    content_b64: Optional[str] = None
    expected_sha256: Optional[str] = None
    mode: Optional[Union[int, str]] = None
    make_parents: bool = False

    def validate(self) -> "WriteRequest":
        if (self.content is None) == (self.content_b64 is None):
            raise ApiError(400, "bad_request", "give exactly one of content and content_b64")
        if self.expected_sha256 is None:
            return self
        h = self.expected_sha256.lower()
        if len(h) != 64 or any(c not in "0123456789abcdef" for c in h):
            raise ApiError(400, "bad_value", "expected_sha256 must be 64 hex digits")
        return self._replace(expected_sha256=h)

    def file_mode(self) -> Optional[int]:
        if self.mode is None:
            return None
        if isinstance(self.mode, str):
            try:
                mode = int(self.mode, 8)
            except ValueError:
                raise ApiError(400, "bad_value", 'mode must be octal digits like "0644"') from None
        else:
            mode = self.mode
        if not 0 <= mode <= 0o7777:
            raise ApiError(400, "bad_value", "mode must be between 0 and 07777")
        return mode


class EnvRequest(NamedTuple):
    set: Dict[str, str] = {}  # never mutated: requests are read-only
    unset: List[str] = []

    def validate(self) -> "EnvRequest":
        for name in list(self.set) + list(self.unset):
            if not _is_name(name):
                raise ApiError(400, "bad_value", "%r is not a shell variable name" % name)
            if name.startswith("SANDMAN_EXECD") or name.startswith("__sm_"):
                raise ApiError(400, "bad_value", "%s belongs to execd" % name)
        for name, value in self.set.items():
            no_nul(name, value)
        return self


def _is_name(name: str) -> bool:
    return (
        bool(name)
        and (name[0].isalpha() or name[0] == "_")
        and all(c.isalnum() or c == "_" for c in name)
        and name.isascii()
    )


class StateRequest(NamedTuple):
    repos: Optional[List[str]] = None
    roots: Optional[List[str]] = None
    site_packages: Optional[List[str]] = None
    max_copy_bytes: Optional[int] = None
    copy_budget_bytes: Optional[int] = None


def split_hostport(text: str) -> Tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError("expected HOST:PORT, got %r" % text)
    return host.strip("[]"), int(port)
