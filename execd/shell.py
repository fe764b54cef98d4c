"""The persistent shell service: one command at a time, timeouts, restarts, reset.

Invariants:
- One command runs at a time: ``run`` takes ``_busy`` without waiting and
  raises ``Busy`` otherwise (HTTP 409). Restarting the shell happens only
  while holding ``_busy``; ``close`` takes it for good (after killing the
  sandbox, so a running command returns), so no shell starts after close.
- A result is built only from a valid status frame (``frames.FrameParser``),
  from the shell's own exit, or from our timeout; whenever the frame is
  invalid or the shell died, every sandbox process is killed and a new shell
  started before the answer, and the answer says so - never a guessed status.
- Shell death is noticed at once through a pidfd (or a 50 ms poll where
  pidfd_open is missing), never at the command timeout, even while a child
  still holds the output pipe (Table A22).
"""

import logging
import os
import select
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from .bashproc import BashProcess
from .frames import FrameError, FrameParser, OutputCapture
from .procs import Cgroup, ProcessTracker, boot_ticks, kill_processes
from .protocol import ExecAnswer
from .streaming import Sink, capture_for
from .timeouts import Timeout

if TYPE_CHECKING:  # names used in annotations only
    from .frames import Frame
    from .procs import Reaper

log = logging.getLogger("execd.shell")


class Busy(Exception):
    """Another command is running in the shell."""


class _Outcome(object):
    def __init__(self) -> None:
        self.frame: Optional["Frame"] = None
        self.frame_error = None  # type: Optional[str]
        self.died = False
        self.timed_out = False
        self.gave_up = False
        self.killed = []  # type: List[int]


class Shell:
    def __init__(
        self,
        bash: str,
        workspace: str,
        run_dir: str,
        env: Dict[str, str],
        tracker: ProcessTracker,
        cgroup: Optional[Cgroup],
        kill_grace: float,
        output_cap: int,
        test_hooks: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._args = (
            bash,
            workspace,
            run_dir,
            tracker.session,
            env,
            tracker.reaper,
            cgroup,
            test_hooks,
        )
        self.tracker = tracker
        self.reaper: "Reaper" = tracker.reaper
        self.cgroup = cgroup
        self.kill_grace = kill_grace
        self.output_cap = output_cap
        self.clock = clock
        self._busy = threading.Lock()
        self._resetting = False
        self._closing = False
        self._proc = None  # type: Optional[BashProcess]

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        self._proc = BashProcess(*self._args)
        res = self._run_locked(":", 30.0, "", {})
        if res.exit_code != 0 or res.shell_restarted:
            raise RuntimeError("the shell did not start: %s" % (res.error or res.output))

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll_exit() is None

    def close(self) -> Dict[str, List[int]]:
        """Kill every process the sandbox started; a running command returns (without a
        restart) and ``_busy`` is then kept, so no command starts again."""
        self._closing = True
        report = self.kill_sandbox()  # a running /exec sees its shell die and returns
        if not self._busy.acquire(timeout=self.kill_grace + 10.0):
            log.warning("the running command did not release the shell at close")
        if self._proc is not None:
            self._proc.close(self.reaper)
            self._proc = None
        return report

    def kill_sandbox(self) -> Dict[str, List[int]]:
        """Kill every process the sandbox started, the shell included."""
        helpers = self.reaper.known() - {self.pid}
        return kill_processes(
            lambda: self.tracker.sandbox_processes(exclude=helpers),
            self.kill_grace,
            {os.getpgrp()},
            self.reaper,
            self.cgroup,
        )

    def _restart(self) -> Dict[str, List[int]]:
        """Kill the sandbox's processes and start a fresh shell (caller holds _busy)."""
        report = self.kill_sandbox()
        if self._proc is not None:
            self._proc.close(self.reaper)
        self._proc = BashProcess(*self._args)
        return report

    def reset(self) -> Dict[str, Any]:
        """Kill everything the sandbox started and start a fresh shell."""
        self._resetting = True
        try:
            report = self.kill_sandbox()  # a running /exec sees its shell die and returns
            if not self._busy.acquire(timeout=60):
                raise RuntimeError("the running command did not release the shell")
            try:
                report2 = self._restart()
            finally:
                self._busy.release()
        finally:
            self._resetting = False
        return {
            "killed": sorted(set(report["signalled"]) | set(report2["signalled"])),
            "survivors": report2["survivors"],
        }

    # -- commands ------------------------------------------------------------

    def run(
        self,
        command: str,
        timeout_s: float,
        cwd: str = "",
        hooks: Optional[Dict[str, Any]] = None,
        isolate: bool = False,
        output_cap: Optional[int] = None,
        sink: Optional[Sink] = None,
    ) -> ExecAnswer:
        """``cwd`` for this call only; ``isolate``: in a subshell; ``output_cap``: this
        call's cap on kept output bytes (execd's --output-cap when None); ``sink``: stream
        the output there as it is read (``streaming.StreamCapture``)."""
        if not self._busy.acquire(blocking=False):
            raise Busy()
        try:
            return self._run_locked(command, timeout_s, cwd, hooks or {}, isolate, output_cap, sink)
        finally:
            self._busy.release()

    def _run_locked(
        self,
        command: str,
        timeout_s: float,
        cwd: str,
        hooks: Dict[str, Any],
        isolate: bool = False,
        output_cap: Optional[int] = None,
        sink: Optional[Sink] = None,
    ) -> ExecAnswer:
        started = self.clock()
        restarted = False
        if self._proc is None or self._proc.poll_exit() is not None or self._proc.status_pending():
            self._restart()  # dead or left junk on the status channel since the last frame
            restarted = True
        proc = self._proc
        assert proc is not None
        marker = os.urandom(8).hex()
        cap = self.output_cap if output_cap is None else output_cap
        capture = capture_for(cap, sink, proc.scrub_bytes)  # type: OutputCapture
        proc.stage(command)
        since = boot_ticks()
        proc.begin()
        try:
            try:
                exposed = bool(hooks.get("expose_status_fd"))
                proc.send(proc.control_line(marker, cwd, exposed, isolate))
            except BrokenPipeError:
                outcome = _Outcome()
                outcome.died = True
            else:
                outcome = self._exchange(
                    proc,
                    marker,
                    started + timeout_s,
                    since,
                    capture,
                    int(hooks.get("status_read_size") or 4096),
                )
        finally:
            proc.end()
        result = self._result(proc, outcome, capture, started, timeout_s, restarted)
        if outcome.timed_out and not result.shell_restarted and command != ":":
            # bash prints the notices of the jobs the timeout killed when its next command
            # starts: let that be this no-op, whose output nobody sees.
            self._run_locked(":", 5.0, "", {})
        return result

    def _exchange(
        self,
        proc: BashProcess,
        marker: str,
        deadline: float,
        since: int,
        capture: OutputCapture,
        read_size: int,
    ) -> _Outcome:
        """Drain output and wait for the frame, the shell's death or the deadline."""
        out = _Outcome()
        parser = FrameParser(marker)
        fds = [proc.out_r, proc.status_r] + ([proc.pidfd] if proc.pidfd is not None else [])
        timeout = None  # type: Optional[Timeout]
        while True:
            now = self.clock()
            if timeout is None and now >= deadline:
                out.timed_out = True
                timeout = Timeout(
                    self.tracker, self.kill_grace, self.clock, proc.pid, marker, since, now
                )
            wait = (deadline if timeout is None else timeout.next_step) - now
            if proc.pidfd is None:
                wait = min(wait, 0.05)  # no pidfd: poll for the shell's death
            ready = select.select(fds, [], [], max(wait, 0.0))[0]
            if proc.out_r in ready:
                proc.read_output(capture)
            status_eof = False
            if proc.status_r in ready:
                data = os.read(proc.status_r, read_size)
                status_eof = not data
                try:
                    out.frame = parser.feed(data) if data else None
                except FrameError as e:
                    out.frame_error = str(e)
                    break
            if out.frame is None and (
                status_eof
                or (proc.pidfd in ready if proc.pidfd is not None else proc.poll_exit() is not None)
            ):
                try:  # the shell is gone: a frame it completed may still be unread
                    rest = proc.status_pending()
                    out.frame = parser.feed(os.read(proc.status_r, rest)) if rest else None
                except FrameError as e:
                    out.frame_error = str(e)
                    break
                if out.frame is None:
                    proc.read_pending(capture)
                    out.died = True
                    out.frame_error = parser.describe_incomplete() if parser.buf else None
                    break
            if out.frame is not None:
                proc.read_pending(capture)
                break
            if timeout is not None and timeout.step(self.clock()):
                out.gave_up = True
                break
        if timeout is not None:
            out.killed = sorted(timeout.signalled) if out.gave_up else timeout.finish()
        return out

    def _result(
        self,
        proc: BashProcess,
        o: _Outcome,
        capture: OutputCapture,
        started: float,
        timeout_s: float,
        restarted: bool,
    ) -> ExecAnswer:
        code, error, error_code = -1, None, None  # type: int, Optional[str], Optional[str]
        output = proc.scrub(capture.text())
        if o.timed_out:
            code, error_code = 124, "timeout"
            error = "command timed out after %gs; killed %d process(es) it started" % (
                timeout_s,
                len(o.killed),
            )
            if o.gave_up:
                error += "; the shell itself did not stop"
        elif o.frame is not None:
            code = o.frame.status
            if o.frame.kind == "s":
                error = proc.check_error() or "bash refused the command's syntax"
                output, error_code = error + "\n", "syntax_error"  # what bash would print
            elif o.frame.kind == "c":
                error = "cd failed: %s" % (proc.check_error() or "cwd is not usable")
                error_code = "cwd_failed"
        elif o.frame_error is not None and not o.died:
            error = "invalid status frame (%s)" % o.frame_error
            error_code = "invalid_frame"
        if self._resetting:  # /reset killed the command (and restarts the shell itself)
            error = _join(error, "interrupted by /reset")
            error_code = "reset"
        elif self._closing:  # execd is stopping: no new shell
            error = _join(error, "interrupted: execd is stopping")
            error_code = "stopping"
        elif o.died or o.gave_up or o.frame is None:
            rc = proc.wait_exit(1.0)  # status EOF can precede the exit becoming visible
            killed = self._restart()["signalled"]
            restarted = True
            if o.died and not o.timed_out:
                code, error = _shell_death(rc, o.frame_error)
                error_code = "shell_died"
            elif error_code is None:
                error_code = "invalid_frame"
            error = _join(
                error,
                "killed %d leftover process(es) and started a new shell "
                "(cwd, variables and functions reset)" % len(killed),
            )
        return ExecAnswer(
            exit_code=code,
            output=output,
            output_bytes=capture.total if error_code != "syntax_error" else len(output.encode()),
            truncated=capture.dropped > 0,
            dropped_bytes=capture.dropped,
            duration_ms=round((self.clock() - started) * 1000.0, 3),
            error=error,
            shell_restarted=restarted,
            timed_out=o.timed_out,
            error_code=error_code,
        )

    def internal(self, command: str, out_name: str, timeout_s: float = 30.0) -> bytes:
        """Run execd's own command (it writes ``$__sm_d/out_name``) and return that file."""
        path = os.path.join(self._args[2], out_name)
        if not self._busy.acquire(blocking=False):
            raise Busy()
        try:
            res = self._run_locked(command, timeout_s, "", {})
            if res.exit_code != 0:
                raise RuntimeError("internal shell command failed: %s" % (res.error or res.output))
            with open(path, "rb") as f:
                return f.read()
        finally:
            self._busy.release()
            try:
                os.unlink(path)
            except OSError:
                pass


def _join(first: Optional[str], second: str) -> str:
    return first + "; " + second if first else second


def _shell_death(rc: Optional[int], frame_error: Optional[str]) -> Tuple[int, str]:
    """Exit code and error for a shell that died during a command (bash convention:
    128 + signal number when killed)."""
    if rc is None:
        return -1, "the shell closed its status channel"
    how = "was killed by signal %d" % -rc if rc < 0 else "exited with status %d" % rc
    detail = " (%s)" % frame_error if frame_error else ""
    return (128 - rc if rc < 0 else rc), "the shell %s%s" % (how, detail)
