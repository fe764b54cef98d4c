"""The execd application object: owns the token, the shell and every service,
and implements one method per route (the route table lives in server.py).

Invariant: all mutable state lives on an ``App`` instance - there is no
module-level token, shell or cache - so two Apps in one process would not
share anything. Handlers validate their whole request (``wire.parse`` into a
``protocol`` shape) before touching the shell or the file system, and build every
answer through its ``protocol`` shape, so the daemon and its clients cannot drift.
"""

import logging
import os
import shlex
import shutil
import tempfile
import threading
import time
from typing import Any, Dict, List, Optional

from . import __version__, probe
from .background import Background
from .config import Config
from .idempotency import KeyTable
from .procs import Cgroup, ProcessTracker, scan, set_child_subreaper
from .protocol import (
    EnvAnswer,
    EnvRequest,
    ExecRequest,
    HealthAnswer,
    ProbeAnswer,
    ReadBytesRequest,
    ReadRequest,
    ResetAnswer,
    SessionRequest,
    SessionsAnswer,
    SignalRequest,
    StateRequest,
    WriteRequest,
)
from .reaper import Reaper
from .sessions import Sessions
from .shell import Busy, Shell
from .streaming import Streamed
from .wire import ApiError, parse, resolve

try:
    # The constant-time comparison hmac.compare_digest falls back to; importing
    # hmac itself loads OpenSSL (~3.5 MiB of RSS) that an idle execd need not carry.
    from _operator import _compare_digest as compare_digest
except ImportError:  # not CPython
    from hmac import compare_digest

log = logging.getLogger("execd.app")

Body = Dict[str, Any]

_ENV_DUMP = (
    '\\builtin compgen -e >| "$__sm_d/env.names"\n'
    "while IFS= \\builtin read -r __sm_n; do [[ -v $__sm_n ]] && "
    '\\builtin printf \'%s=%s\\0\' "$__sm_n" "${!__sm_n}"; done '
    '< "$__sm_d/env.names" >| "$__sm_d/env.out"\n'
    "\\builtin unset -v __sm_n\n"
)
_SITE_DUMP = (
    "if \\builtin command -v python3 >/dev/null 2>&1; then python3 -c 'import site, sys; "
    'sys.stdout.write("\\0".join(site.getsitepackages() + [site.getusersitepackages()]))\' '
    '>| "$__sm_d/site.out" 2>/dev/null || \\builtin : >| "$__sm_d/site.out"; '
    'else \\builtin : >| "$__sm_d/site.out"; fi\n'
)


def _run(
    shell: Shell,
    req: ExecRequest,
    timeout: float,
    cwd: str,
    hooks: Dict[str, Any],
    cap: Optional[int],
    sink: Any,
) -> Body:
    """One ``/exec`` in ``shell`` (plain, or streamed into ``sink``): its answer's JSON."""
    try:
        answer = shell.run(
            req.command,
            timeout,
            cwd,
            hooks,
            bool(req.isolate),
            cap,
            sink,
            separate_stderr=req.stderr == "separate",
        )
    except Busy:
        raise _busy() from None
    return answer.to_json()


class App:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._token = cfg.token.encode()
        self._own_run_dir = cfg.run_dir is None
        self.run_dir = cfg.run_dir or tempfile.mkdtemp(prefix="sandman-execd-")
        os.makedirs(self.run_dir, mode=0o700, exist_ok=True)
        os.chmod(self.run_dir, 0o700)
        self.session = os.urandom(6).hex()
        self.subreaper = cfg.subreaper and set_child_subreaper()
        self.reaper = Reaper(scan)
        self.cgroup = Cgroup(cfg.cgroup) if cfg.cgroup else None
        self.tracker = ProcessTracker(self.session, self.reaper, set(cfg.track), self.cgroup)
        # Sandman's own variables (SANDMAN_SANDBOX, SANDMAN_EXECD*, ...) are execd's
        # environment, never the commands'.
        self._env = {k: v for k, v in os.environ.items() if not k.startswith("SANDMAN_")}
        self.shell = self._new_shell("default", self.run_dir, cfg.startup, True)
        self.sessions = Sessions(
            self.shell, self._new_shell, self.run_dir, cfg.startup, cfg.max_sessions
        )
        self.keys = KeyTable(cfg.idempotency_keys, cfg.idempotency_ttl)
        self.background = Background(
            cfg.bash, cfg.workspace, self.run_dir, self._env, self.reaper, cfg.kill_grace
        )
        self._state_lock = threading.Lock()
        self._lazy_lock = threading.Lock()
        self._files = None  # type: Optional[Any]
        self._state = None  # type: Optional[Any]

    def _new_shell(
        self, name: str, run_dir: str, startup: str, whole_sandbox: bool = False
    ) -> Shell:
        cfg = self.cfg
        return Shell(
            cfg.bash,
            cfg.workspace,
            run_dir,
            self._env,
            self.tracker,
            self.cgroup,
            cfg.kill_grace,
            cfg.output_cap,
            cfg.test_hooks,
            startup=startup,
            startup_timeout=cfg.default_timeout,
            whole_sandbox=whole_sandbox,
        )

    # The file and state services hash with hashlib, which loads OpenSSL: build
    # them on first use so an idle execd stays small.
    @property
    def files(self) -> Any:
        with self._lazy_lock:
            if self._files is None:
                from .files import Files

                self._files = Files(self.cfg.workspace, self.cfg.max_file_bytes)
            return self._files

    @property
    def state(self) -> Any:
        with self._lazy_lock:
            if self._state is None:
                from .state import StateManager

                cfg = self.cfg
                self._state = StateManager(
                    cfg.state_dir or os.path.join(self.run_dir, "state"),
                    cfg.workspace,
                    cfg.state_roots,
                    cfg.site_packages,
                    cfg.state_max_copy_bytes,
                    cfg.state_copy_budget_bytes,
                    [self.run_dir],
                    self.read_env,
                    self.write_env,
                    self._site_packages,
                    self.tracker,
                    lambda: self.shell.pid,
                    cfg.kill_grace,
                )
            return self._state

    def start(self) -> None:
        self.reaper.start()
        self.shell.start()

    def close(self) -> None:
        try:
            self.background.kill_all()
            self.sessions.close()
        finally:
            self.reaper.stop()
            if self._own_run_dir:
                shutil.rmtree(self.run_dir, ignore_errors=True)

    def authorized(self, header: Optional[str]) -> bool:
        if not header or not header.startswith("Bearer "):
            return False
        return compare_digest(header[7:].strip().encode(), self._token)

    # -- shell helpers ------------------------------------------------------------

    def read_env(self) -> Dict[str, str]:
        data = self._internal(_ENV_DUMP, "env.out")
        env = {}
        for item in data.split(b"\0"):
            if item:
                name, _, val = item.partition(b"=")
                env[name.decode("utf-8", "surrogateescape")] = val.decode(
                    "utf-8", "surrogateescape"
                )
        return env

    def write_env(self, set_: Dict[str, str], unset: List[str]) -> None:
        lines = ["__sm_e=0"]
        for name, val in set_.items():
            lines.append("\\builtin export %s=%s || __sm_e=1" % (name, shlex.quote(val)))
        for name in unset:
            lines.append("\\builtin unset -v %s || __sm_e=1" % name)
        lines.append('\\builtin : >| "$__sm_d/set.out"; \\builtin return $__sm_e')
        try:
            self._internal("\n".join(lines) + "\n", "set.out")
        except RuntimeError as e:
            raise ApiError(400, "env_refused", "the shell refused the change: %s" % e) from None

    def _site_packages(self) -> List[str]:
        out = self._internal(_SITE_DUMP, "site.out")
        return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]

    def _internal(self, command: str, out_name: str) -> bytes:
        try:
            return self.shell.internal(command, out_name)
        except Busy:
            raise _busy() from None

    # -- routes --------------------------------------------------------------------

    def health(self, body: Body) -> Body:
        return HealthAnswer(True, __version__, self.shell.alive()).to_json()

    def exec(self, body: Body) -> Any:
        """The answer's JSON, or ``streaming.Streamed`` for ``stream: true``."""
        req = parse(ExecRequest, body)
        hooks = req.test_hooks or {}
        if hooks and not self.cfg.test_hooks:
            raise ApiError(400, "test_hooks_disabled", "test_hooks needs execd --test-hooks")
        size = hooks.get("status_read_size", 1)
        if (
            set(hooks) - {"expose_status_fd", "status_read_size"}
            or not isinstance(size, int)
            or isinstance(size, bool)
            or size < 1
        ):
            raise ApiError(
                400,
                "bad_value",
                "test_hooks takes expose_status_fd (bool) and status_read_size (int >= 1)",
            )
        cwd = ""
        if req.cwd is not None:
            cwd = resolve(self.cfg.workspace, req.cwd)
            if not os.path.isdir(cwd):
                raise ApiError(400, "bad_cwd", "cwd %s is not an existing directory" % cwd)
        limit = self.cfg.max_output_bytes
        if req.max_output_bytes is not None and req.max_output_bytes > limit:
            raise ApiError(
                400,
                "bad_value",
                "max_output_bytes may be at most %d (this sandbox's limit)" % limit,
                limit=limit,
            )
        timeout = req.timeout_s if req.timeout_s is not None else self.cfg.default_timeout
        shell = self.sessions.get(req.session)
        if req.background:
            return self._background(req, cwd, hooks)
        if req.stream:
            return self._streamed(shell, req, timeout, cwd, hooks)
        return _run(shell, req, timeout, cwd, hooks, req.max_output_bytes, None)

    def _streamed(
        self, shell: Shell, req: ExecRequest, timeout: float, cwd: str, hooks: Dict[str, Any]
    ) -> Streamed:
        # A stream keeps no output for its final frame, so its cap defaults to the job's
        # limit (--max-output-bytes), not to --output-cap.
        cap = self.cfg.max_output_bytes if req.max_output_bytes is None else req.max_output_bytes

        return Streamed(lambda sink: _run(shell, req, timeout, cwd, hooks, cap, sink))

    def _background(self, req: ExecRequest, cwd: str, hooks: Dict[str, Any]) -> Body:
        if req.stream or hooks:
            raise ApiError(400, "bad_request", "background takes neither stream nor test_hooks")
        # No default timeout: a background server runs until signalled or /reset.
        cap = self.cfg.max_output_bytes if req.max_output_bytes is None else req.max_output_bytes
        return self.background.start(req.command, cwd, req.timeout_s, cap)

    def exec_poll(self, body: Body, id: str, query: str = "") -> Body:  # noqa: A002
        from urllib.parse import parse_qs  # http.server has loaded it already

        args = {"offset": 0, "max_bytes": 1 << 20}
        for name, values in parse_qs(query).items():
            if name not in args or not values[-1].isdigit():
                raise ApiError(400, "bad_value", "the query takes offset and max_bytes (>= 0)")
            args[name] = int(values[-1])
        return self.background.poll(id, args["offset"], args["max_bytes"])

    def exec_signal(self, body: Body, id: str) -> Body:  # noqa: A002
        return self.background.signal(id, parse(SignalRequest, body).signal)

    def files_read(self, body: Body) -> Body:
        return self.files.read(parse(ReadRequest, body)).to_json()

    def files_read_bytes(self, body: Body) -> Body:
        return self.files.read_bytes(parse(ReadBytesRequest, body)).to_json()

    def files_write(self, body: Body) -> Body:
        return self.files.write(parse(WriteRequest, body)).to_json()

    def env_get(self, body: Body) -> Body:
        return EnvAnswer(self.read_env()).to_json()

    def env_post(self, body: Body) -> Body:
        req = parse(EnvRequest, body)
        self.write_env(req.set, req.unset)
        return EnvAnswer(self.read_env()).to_json()

    def reset(self, body: Body) -> Body:
        started = time.monotonic()
        killed = self.background.kill_all()
        report = self.sessions.reset()
        report["killed"] = sorted(set(report["killed"]) | set(killed))
        return ResetAnswer(
            killed=report["killed"],
            survivors=report["survivors"],
            shell_alive=self.shell.alive(),
            duration_ms=round((time.monotonic() - started) * 1000, 1),
        ).to_json()

    def sessions_create(self, body: Body) -> Body:
        req = parse(SessionRequest, body)
        return self.sessions.create(req.name, req.startup or "", req.startup_timeout_s).to_json()

    def sessions_list(self, body: Body) -> Body:
        return SessionsAnswer([s.to_json() for s in self.sessions.list()]).to_json()

    def session_delete(self, body: Body, name: str) -> Body:
        return self.sessions.delete(name).to_json()

    def session_interrupt(self, body: Body, name: str) -> Body:
        return self.sessions.interrupt(name).to_json()

    def probe(self, body: Body) -> Body:
        try:
            env = self.read_env()  # type: Optional[Dict[str, str]]
        except RuntimeError:
            log.warning("probe: the shell environment is unreadable", exc_info=True)
            env = None
        readings = probe.probe(
            self.cfg.probe_egress_target,
            self.cfg.probe_egress_timeout,
            self.cfg.cgroup_root,
            self.cfg.default_timeout,
            env,
        )
        return ProbeAnswer(readings).to_json()

    def state_baseline(self, body: Body) -> Body:
        return self._stateful(self.state.baseline, parse(StateRequest, body))

    def state_check(self, body: Body) -> Body:
        parse(StateRequest, body)
        return self._stateful(self.state.check)

    def state_restore(self, body: Body) -> Body:
        parse(StateRequest, body)
        return self._stateful(self.state.restore)

    def _stateful(self, fn: Any, *args: Any) -> Body:
        if not self._state_lock.acquire(blocking=False):
            raise ApiError(409, "busy", "another state operation is running")
        try:
            return fn(*args).to_json()
        finally:
            self._state_lock.release()


def _busy() -> ApiError:
    return ApiError(
        409,
        "busy",
        "a command is already running in this sandbox's shell; wait for it or POST /reset",
    )
