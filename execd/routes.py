"""execd's route table: each (method, path) the protocol declares, joined to the ``App``
method that answers it, with path templates (``{param}`` segments) and HTTP reasons.

Invariant: ``ROUTES`` has exactly ``protocol.ROUTES``'s keys (a KeyError at import if a
declared route has no handler); a template segment matches one non-empty path segment,
which the handler gets as a keyword argument.
"""

from typing import Dict, NamedTuple, Optional, Tuple

from . import protocol


class Route(NamedTuple):
    handler: str  # App method name
    auth: bool


HANDLERS = {
    ("GET", "/health"): "health",
    ("POST", "/exec"): "exec",
    ("POST", "/files/read"): "files_read",
    ("POST", "/files/read_bytes"): "files_read_bytes",
    ("POST", "/files/write"): "files_write",
    ("GET", "/env"): "env_get",
    ("POST", "/env"): "env_post",
    ("POST", "/reset"): "reset",
    ("POST", "/state/baseline"): "state_baseline",
    ("POST", "/state/check"): "state_check",
    ("POST", "/state/restore"): "state_restore",
    ("GET", "/probe"): "probe",
    ("GET", "/exec/{id}"): "exec_poll",  # templated: the handler gets (body, id, query)
    ("POST", "/exec/{id}/signal"): "exec_signal",
    ("POST", "/sessions"): "sessions_create",
    ("GET", "/sessions"): "sessions_list",
    ("DELETE", "/sessions/{name}"): "session_delete",
    ("POST", "/sessions/{name}/interrupt"): "session_interrupt",
}
# Every route the protocol declares, with its auth rule from there (a KeyError at import
# if a declared route has no handler).
ROUTES = {key: Route(HANDLERS[key], shape.auth) for key, shape in protocol.ROUTES.items()}  # type: Dict[Tuple[str, str], Route]
PATHS = frozenset(path for _method, path in ROUTES)
# Paths with ``{param}`` segments; a segment matches one non-empty path segment, which
# the handler gets as a keyword argument.
TEMPLATES = [(m, p.strip("/").split("/")) for m, p in ROUTES if "{" in p]


# handlers that also take the query string
QUERY_HANDLERS = frozenset({"exec_poll"})


def match(method: str, path: str) -> Tuple[Optional[Route], Dict[str, str], bool]:
    """The route, its path parameters, and whether the path exists (for another
    method: a 405)."""
    route = ROUTES.get((method, path))
    if route is not None:
        return route, {}, True
    parts = path.strip("/").split("/")
    known = path in PATHS
    for m, pattern in TEMPLATES:
        if len(pattern) != len(parts):
            continue
        params = {}
        for i, want in enumerate(pattern):
            got = parts[i]
            if want.startswith("{"):
                if not got:
                    break
                params[want[1:-1]] = got
            elif want != got:
                break
        else:
            if m == method:
                return ROUTES[(m, "/" + "/".join(pattern))], params, True
            known = True
    return None, {}, known


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    409: "Conflict",
    411: "Length Required",
    413: "Payload Too Large",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
}
