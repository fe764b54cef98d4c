"""Command-line configuration, read once at start into an immutable ``Config``.

``python3 -m execd --port PORT --token-file FILE --workspace DIR [options]`` (or
``--listen-fd FD``: an inherited listening socket instead of a port), and
``--token-key-file KEY --token-name NAME`` instead of ``--token-file``: the token is then
HMAC-SHA256(key, NAME) in hex (``tokens.py``; a Kubernetes pod names itself, and the key
is its job's).

Invariant: nothing else in execd reads argv, the environment or the token
file; the token is read here once and lives only on the ``App`` object (it is
never exported to the shell, and its file path is not either). A key file is read
here once and only the token derived from it is kept; ``--unlink-token-file``
removes whichever file was read.
"""

import argparse
import os
from typing import List, NamedTuple, Optional, Sequence

from .limits import Limits
from .tokens import derive_token

DEFAULT_STATE_MAX_COPY = 1 << 20
DEFAULT_STATE_BUDGET = 64 << 20


class Config(NamedTuple):
    host: str
    port: int
    token: str
    workspace: str
    run_dir: Optional[str]
    state_dir: Optional[str]
    state_roots: Optional[List[str]]
    site_packages: Optional[List[str]]
    state_max_copy_bytes: int
    state_copy_budget_bytes: int
    default_timeout: float
    output_cap: int
    max_output_bytes: int
    kill_grace: float
    max_body_bytes: int
    max_file_bytes: int
    probe_egress_target: str
    probe_egress_timeout: float
    cgroup_root: str
    cgroup: Optional[str]
    track: List[str]
    subreaper: bool
    bash: str
    test_hooks: bool
    verbose: bool
    limits: Limits
    startup: str  # --startup-file's text: run first in every session's shell
    max_sessions: int
    idempotency_keys: int = 1024
    idempotency_ttl: float = 600.0
    listen_fd: Optional[int] = None  # an inherited listening TCP socket, used instead of --port


def _paths(text: Optional[str]) -> Optional[List[str]]:
    if text is None:
        return None
    parts = text.replace(",", os.pathsep).split(os.pathsep)
    return [os.path.abspath(os.path.expanduser(p)) for p in parts if p]


def _read_token(p: argparse.ArgumentParser, a: argparse.Namespace) -> str:
    """The token from --token-file, or derived from --token-key-file and --token-name."""
    if (a.token_file is None) == (a.token_key_file is None):
        p.error("give exactly one of --token-file and --token-key-file")
    if a.token_key_file is not None and not a.token_name:
        p.error("--token-key-file needs --token-name")
    path = a.token_file if a.token_file is not None else a.token_key_file
    with open(path, "rb") as f:
        content = f.read().strip()
    if not content:
        p.error("the token file is empty" if a.token_file else "the key file is empty")
    if a.unlink_token_file:
        os.unlink(path)
    if a.token_key_file is not None:
        return derive_token(content, a.token_name)
    return content.decode()


def parse_args(argv: Optional[Sequence[str]] = None) -> Config:
    p = argparse.ArgumentParser(prog="python3 -m execd", description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, help="TCP port; 0 picks a free one")
    p.add_argument(
        "--listen-fd",
        type=int,
        help="accept on this inherited listening TCP socket instead of binding --port "
        "(a local sandbox's socket bound in the host's network namespace)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--token-file", help="file holding the bearer token")
    p.add_argument(
        "--token-key-file",
        help="file holding the job's key; the token is HMAC-SHA256(key, --token-name), hex",
    )
    p.add_argument("--token-name", help="the name the token is derived for (the pod's)")
    p.add_argument(
        "--unlink-token-file",
        action="store_true",
        help="remove the token (or key) file once read, so commands of the same user "
        "cannot read it",
    )
    p.add_argument(
        "--workspace",
        required=True,
        help="the shell's start directory; relative paths in requests resolve against it",
    )
    p.add_argument(
        "--run-dir",
        help="private directory for command files (default: a new temp dir, removed at exit)",
    )
    p.add_argument(
        "--state-dir", help="where /state/baseline keeps its record (default: RUN_DIR/state)"
    )
    p.add_argument(
        "--state-roots",
        help="comma- or colon-separated directories the state "
        "check scans (default: /etc, home directories, /tmp, local bin dirs); a "
        "workspace that is not a git repository is added either way",
    )
    p.add_argument(
        "--site-packages",
        help="installed-package directories to scan two levels "
        "deep (default: asked from the shell's python3)",
    )
    p.add_argument("--state-max-copy-bytes", type=int, default=DEFAULT_STATE_MAX_COPY)
    p.add_argument("--state-copy-budget-bytes", type=int, default=DEFAULT_STATE_BUDGET)
    p.add_argument("--default-timeout", type=float, default=300.0)
    p.add_argument(
        "--output-cap", type=int, default=100 * 1024, help="output bytes kept per command"
    )
    p.add_argument(
        "--max-output-bytes",
        type=int,
        default=16 << 20,
        help="the most a call may ask for with max_output_bytes (the job's limit)",
    )
    p.add_argument(
        "--kill-grace", type=float, default=1.0, help="seconds between SIGTERM and SIGKILL"
    )
    p.add_argument("--max-body-bytes", type=int, default=64 << 20)
    p.add_argument("--max-file-bytes", type=int, default=32 << 20)
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=3600.0,
        help="seconds a kept-alive connection may idle",
    )
    p.add_argument(
        "--header-timeout",
        type=float,
        default=10.0,
        help="seconds from a request's first byte to the end of its headers (then 408)",
    )
    p.add_argument(
        "--body-timeout",
        type=float,
        default=120.0,
        help="seconds to receive a whole body, and to write an answer (then 408)",
    )
    p.add_argument(
        "--max-connections", type=int, default=1024, help="open connections; more get 429"
    )
    p.add_argument("--probe-egress-target", default="1.1.1.1:443")
    p.add_argument("--probe-egress-timeout", type=float, default=1.0)
    p.add_argument("--cgroup-root", default="/sys/fs/cgroup")
    p.add_argument(
        "--cgroup",
        help="a writable cgroup (v1 or v2) directory to hold the "
        "shell and everything it starts; reset kills its members too",
    )
    p.add_argument(
        "--track",
        default="tree,cgroup",
        help="how sandbox processes are found (tree, cgroup)",
    )
    p.add_argument(
        "--idempotency-keys",
        type=int,
        default=1024,
        help="Idempotency-Key answers remembered (oldest forgotten first)",
    )
    p.add_argument(
        "--idempotency-ttl",
        type=float,
        default=600.0,
        help="seconds an Idempotency-Key's answer is remembered",
    )
    p.add_argument("--no-subreaper", dest="subreaper", action="store_false")
    p.add_argument("--bash", default="bash")
    p.add_argument(
        "--startup-file",
        help="a bash script run first in every session's shell (the job's startup, "
        "e.g. conda activate); read once at start",
    )
    p.add_argument(
        "--max-sessions", type=int, default=32, help="named sessions, the default included"
    )
    p.add_argument("--test-hooks", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--verbose", action="store_true")
    a = p.parse_args(argv)
    if (a.port is None) == (a.listen_fd is None):
        p.error("give exactly one of --port and --listen-fd")
    token = _read_token(p, a)
    startup = ""
    if a.startup_file:
        with open(a.startup_file, "rb") as f:
            startup = f.read().decode("utf-8", "surrogateescape")
        if "\0" in startup:
            p.error("the startup file holds a NUL byte")
    workspace = os.path.abspath(a.workspace)
    if not os.path.isdir(workspace):
        p.error("the workspace %s is not a directory" % workspace)
    return Config(
        host=a.host,
        port=a.port if a.port is not None else 0,
        token=token,
        workspace=workspace,
        run_dir=os.path.abspath(a.run_dir) if a.run_dir else None,
        state_dir=os.path.abspath(a.state_dir) if a.state_dir else None,
        state_roots=_paths(a.state_roots),
        site_packages=_paths(a.site_packages),
        state_max_copy_bytes=a.state_max_copy_bytes,
        state_copy_budget_bytes=a.state_copy_budget_bytes,
        default_timeout=a.default_timeout,
        output_cap=a.output_cap,
        max_output_bytes=max(a.max_output_bytes, a.output_cap),
        kill_grace=a.kill_grace,
        max_body_bytes=a.max_body_bytes,
        max_file_bytes=a.max_file_bytes,
        probe_egress_target=a.probe_egress_target,
        probe_egress_timeout=a.probe_egress_timeout,
        cgroup_root=a.cgroup_root,
        cgroup=a.cgroup,
        track=[t for t in a.track.split(",") if t],
        subreaper=a.subreaper,
        bash=a.bash,
        test_hooks=a.test_hooks,
        verbose=a.verbose,
        limits=Limits(a.idle_timeout, a.header_timeout, a.body_timeout, a.max_connections),
        idempotency_keys=max(1, a.idempotency_keys),
        idempotency_ttl=a.idempotency_ttl,
        listen_fd=a.listen_fd,
        startup=startup,
        max_sessions=max(1, a.max_sessions),
    )
