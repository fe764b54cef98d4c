"""Named persistent shells: ``POST /sessions``, ``GET /sessions``, ``DELETE
/sessions/{name}``, ``POST /sessions/{name}/interrupt`` and ``/exec``'s ``session``.

Each session is one ``shell.Shell`` with its own bash, pipes and command files (its run
directory is ``RUN_DIR/sessions/<name>``), so sessions run commands at the same time and
each answers a second concurrent command 409 ``busy`` on its own. The ``default`` session
is the shell execd always had: it cannot be deleted, and ``/reset`` and execd's shutdown
go through it (they reach every process of the sandbox).

Invariants: the registry's lock guards only the name -> Shell map (never held while a
shell starts, runs or stops a command); a name is reserved before its shell starts, so
two creates of one name cannot both start a shell; at most ``limit`` sessions exist,
``default`` included. The sandbox's startup script (``--startup-file``: the job's, e.g.
``conda activate``) runs first in every session's shell, then the session's own.
"""

import os
import shutil
import threading
from typing import Callable, Dict, List, Optional

from .protocol import DeletedAnswer, InterruptAnswer, SessionAnswer
from .shell import Shell
from .wire import ApiError, session_name

DEFAULT = "default"

ShellFactory = Callable[[str, str, str], Shell]  # (name, run_dir, startup) -> a new Shell


class Sessions:
    def __init__(
        self, default: Shell, factory: ShellFactory, run_dir: str, startup: str, limit: int
    ) -> None:
        self._shells = {DEFAULT: default}  # type: Dict[str, Optional[Shell]]
        self._factory = factory
        self._root = os.path.join(run_dir, "sessions")
        self._startup = startup
        self._limit = limit
        self._lock = threading.Lock()

    @property
    def default(self) -> Shell:
        shell = self._shells[DEFAULT]
        assert shell is not None
        return shell

    def get(self, name: Optional[str]) -> Shell:
        with self._lock:
            shell = self._shells.get(name or DEFAULT)
        if shell is None:
            raise ApiError(
                404, "no_session", "no session %r (create it with POST /sessions)" % name
            )
        return shell

    def create(self, name: str, startup: str, startup_timeout: Optional[float]) -> SessionAnswer:
        with self._lock:
            if name in self._shells:
                raise ApiError(409, "session_exists", "the session %r exists" % name)
            if len(self._shells) >= self._limit:
                raise ApiError(
                    409,
                    "too_many_sessions",
                    "this sandbox has its limit of %d sessions; delete one first" % self._limit,
                    limit=self._limit,
                )
            self._shells[name] = None  # reserved while its shell starts
        try:
            run_dir = os.path.join(self._root, name)
            os.makedirs(run_dir, mode=0o700, exist_ok=True)
            script = "\n".join(s for s in (self._startup, startup) if s)
            shell = self._factory(name, run_dir, script)
            if startup_timeout is not None:
                shell.startup_timeout = startup_timeout
            ran = shell.start()
        except BaseException:
            with self._lock:
                self._shells.pop(name, None)
            raise
        with self._lock:
            self._shells[name] = shell
        return _describe(name, shell, ran.to_json() if ran is not None else None)

    def list(self) -> List[SessionAnswer]:
        with self._lock:
            items = [(n, s) for n, s in self._shells.items() if s is not None]
        return [_describe(n, s) for n, s in items]

    def delete(self, name: str) -> DeletedAnswer:
        session_name(name)
        if name == DEFAULT:
            raise ApiError(
                400, "default_session", "the default session cannot be deleted (POST /reset)"
            )
        with self._lock:
            shell = self._shells.get(name)
            if shell is None:
                raise ApiError(404, "no_session", "no session %r" % name)
            del self._shells[name]
        report = shell.close()  # a running command answers session_closed
        shutil.rmtree(os.path.join(self._root, name), ignore_errors=True)
        return DeletedAnswer(name, report["signalled"])

    def interrupt(self, name: str) -> InterruptAnswer:
        session_name(name)
        pgid = self.get(name).interrupt()
        return InterruptAnswer(name, pgid is not None, pgid)

    def reset(self) -> Dict[str, List[int]]:
        """``/reset``: kill every process of the sandbox (every session's shell too),
        then start each session's shell again, its startup script first."""
        others = self._others()
        for shell in others:
            shell.resetting = True  # their running commands answer "reset", not a death
        try:
            report = self.default.reset()
            for shell in others:
                shell.reset(kill=False)
        finally:
            for shell in others:
                shell.resetting = False
        return report

    def close(self) -> None:
        """execd is stopping: every named shell, then the default one (which kills
        every process of the sandbox)."""
        others = self._others()
        for shell in others:
            shell.closing = True
        try:
            self.default.close()
        finally:
            for shell in others:
                shell.close()

    def _others(self) -> List[Shell]:
        with self._lock:
            return [s for n, s in self._shells.items() if n != DEFAULT and s is not None]


def _describe(name: str, shell: Shell, startup: Optional[dict] = None) -> SessionAnswer:
    return SessionAnswer(name, shell.pid, shell.alive(), shell.busy(), startup)
