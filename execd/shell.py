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
- One Shell is one session (``sessions.py``): a restart kills only this shell's
  process tree (and orphans of dead shells), never another session's; only
  ``kill_sandbox`` (``/reset``, execd's shutdown, closing the default session)
  reaches every process. A session's ``startup`` script runs first in every shell
  it starts, before any command.
"""

import logging
import os
import select
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from .bashproc import BashProcess
from .frames import FrameError, FrameParser, OutputCapture
from .interrupts import Interrupts
from .outcome import Busy, Outcome, classify, join, shell_death
from .procs import Cgroup, ProcessTracker, boot_ticks, kill_processes
from .protocol import ExecAnswer
from .streaming import Sink, captures_for
from .timeouts import Timeout

if TYPE_CHECKING:  # names used in annotations only
    from .reaper import Reaper

log = logging.getLogger("execd.shell")


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
        startup: str = "",
        startup_timeout: float = 300.0,
        whole_sandbox: bool = True,
    ) -> None:
        """``startup``: run first in every shell this session starts; ``whole_sandbox``:
        ``close`` kills every sandbox process (the default session), else this shell's."""
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
        # also set by ``sessions.Sessions`` around a /reset or shutdown another session's
        # shell carries out: a command running here then answers why it ended
        self.resetting = False
        self.closing = False
        self._proc = None  # type: Optional[BashProcess]
        self.startup = startup
        self.startup_timeout = startup_timeout
        self.whole_sandbox = whole_sandbox
        self._in_startup = False
        self.interrupts = Interrupts(tracker, clock, self._busy.locked)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> Optional[ExecAnswer]:
        """Start the shell; the startup script's answer (None without one)."""
        self._proc = BashProcess(*self._args)
        res = self._run_locked(":", 30.0, "", {})
        if res.exit_code != 0 or res.shell_restarted:
            raise RuntimeError("the shell did not start: %s" % (res.error or res.output))
        return self._run_startup()

    def _run_startup(self) -> Optional[ExecAnswer]:
        if not self.startup or self._in_startup:
            return None  # (a startup that killed its shell does not run again at once)
        self._in_startup = True
        try:
            res = self._run_locked(self.startup, self.startup_timeout, "", {})
        finally:
            self._in_startup = False
        if res.exit_code != 0 or res.error:
            log.warning("startup script: exit %d %s", res.exit_code, res.error or "")
        return res

    def busy(self) -> bool:
        """A command (or execd's own) is running in this shell."""
        return self._busy.locked()

    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll_exit() is None

    def close(self) -> Dict[str, List[int]]:
        """Kill every process the sandbox started; a running command returns (without a
        restart) and ``_busy`` is then kept, so no command starts again."""
        self.closing = True
        # a running /exec sees its shell die and returns
        report = self.kill_sandbox() if self.whole_sandbox else self.kill_own()
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

    def kill_own(self) -> Dict[str, List[int]]:
        """Kill this shell and its process tree (what its commands orphaned included: the
        shell is their subreaper), and orphans of shells that died (execd's children
        nobody waits for); other sessions' shells and processes stay."""
        collect = lambda: self.tracker.shell_processes(self.pid, self.reaper.known())  # noqa: E731
        return kill_processes(collect, self.kill_grace, {os.getpgrp()}, self.reaper, None)

    def _restart(self) -> Dict[str, List[int]]:
        """Kill this shell's processes, start a fresh one and its startup (holding _busy)."""
        report = self.kill_own()
        if self._proc is not None:
            self._proc.close(self.reaper)
        self._proc = BashProcess(*self._args)
        self._run_startup()
        return report

    def interrupt(self) -> Optional[int]:
        """Interrupt the running command (``interrupts.Interrupts``: never lost, even before
        its first job): the process group sent SIGINT (0: none yet, or a builtin was
        running, unwound instead), None when none runs."""
        return self.interrupts.request()

    def reset(self, kill: bool = True) -> Dict[str, Any]:
        """Kill all the sandbox started (``kill``: unless done already); start a fresh shell."""
        self.resetting = True
        try:
            # a running /exec sees its shell die and returns
            report = self.kill_sandbox() if kill else {"signalled": [], "survivors": []}
            if not self._busy.acquire(timeout=60):
                raise RuntimeError("the running command did not release the shell")
            try:
                report2 = self._restart()
            finally:
                self._busy.release()
        finally:
            self.resetting = False
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
        *,
        separate_stderr: bool = False,
    ) -> ExecAnswer:
        """``cwd``: this call only; ``isolate``: a subshell; ``output_cap``: kept bytes (None:
        --output-cap); ``sink``: streamed output (``streaming.StreamCapture``)."""
        if not self._busy.acquire(blocking=False):
            raise Busy()
        try:
            args = (command, timeout_s, cwd, hooks or {}, isolate, output_cap, sink)
            return self._run_locked(*args, separate_stderr=separate_stderr)
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
        *,
        separate_stderr: bool = False,
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
        capture, errors = captures_for(cap, sink, proc.scrub_bytes, self.clock, separate_stderr)
        proc.stage(command)
        since = boot_ticks()
        proc.begin()
        self.interrupts.staged()
        try:
            try:
                exposed = bool(hooks.get("expose_status_fd"))
                proc.send(proc.control_line(marker, cwd, exposed, isolate, separate_stderr))
            except BrokenPipeError:
                outcome = Outcome()
                outcome.died = True
            else:
                self.interrupts.sent(proc, since)  # its recovery line only after this
                outcome = self._exchange(
                    proc,
                    marker,
                    started + timeout_s,
                    since,
                    capture,
                    int(hooks.get("status_read_size") or 4096),
                    errors,
                )
        finally:
            self.interrupts.ended()
            proc.end()
        result = self._result(proc, outcome, capture, started, timeout_s, restarted, errors)
        interrupted = result.error_code == "interrupted"
        if (outcome.timed_out or interrupted) and not result.shell_restarted and command != ":":
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
        errors: Optional[OutputCapture] = None,
    ) -> Outcome:
        """Drain output (stderr into ``errors``, or dropped) until the frame, death or deadline."""
        out = Outcome()
        parser = FrameParser(marker)
        fds = [proc.out_r, proc.status_r, proc.err_r]
        fds += [proc.pidfd] if proc.pidfd is not None else []
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
            if capture.due is not None:  # held stream frames: out by then, or with the frame
                wait = min(wait, capture.due - now)
            wait = self.interrupts.poll(proc, since, now, wait)
            ready = select.select(fds, [], [], max(wait, 0.0))[0]
            if proc.out_r in ready:
                proc.read_output(capture)
            if proc.err_r in ready:
                proc.read_output(errors, fd=proc.err_r)
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
                    proc.read_pending(errors, proc.err_r)
                    out.died = True
                    out.frame_error = parser.describe_incomplete() if parser.buf else None
                    break
            if out.frame is not None:
                proc.read_pending(capture)
                proc.read_pending(errors, proc.err_r)
                break
            if capture.due is not None and self.clock() >= capture.due:
                capture.flush()
            if timeout is not None and timeout.step(self.clock()):
                out.gave_up = True
                break
        if timeout is not None:
            out.killed = sorted(timeout.signalled) if out.gave_up else timeout.finish()
        return out

    def _result(
        self,
        proc: BashProcess,
        o: Outcome,
        capture: OutputCapture,
        started: float,
        timeout_s: float,
        restarted: bool,
        errors: Optional[OutputCapture] = None,
    ) -> ExecAnswer:
        output = proc.scrub(capture.text())
        stderr = proc.scrub(errors.text()) if errors is not None else None
        code, error, error_code = classify(o, proc, timeout_s)
        if error_code == "syntax_error" and stderr is None:
            output = (error or "") + "\n"  # what bash would print
        elif error_code == "syntax_error":
            stderr = (error or "") + "\n"
        if self.interrupts.interrupted and o.frame is not None and not o.timed_out:
            if o.frame.status == 124 and o.frame.kind == "x":  # the unwind of a builtin
                code = 130
            error, error_code = "interrupted: SIGINT to the foreground process group", "interrupted"
        if self.resetting:  # /reset killed the command (and restarts the shell itself)
            error = join(error, "interrupted by /reset")
            error_code = "reset"
        elif self.closing and not self.whole_sandbox:  # DELETE /sessions/{name}
            error = join(error, "interrupted: the session was deleted")
            error_code = "session_closed"
        elif self.closing:  # execd is stopping: no new shell
            error = join(error, "interrupted: execd is stopping")
            error_code = "stopping"
        elif o.died or o.gave_up or o.frame is None:
            rc = proc.wait_exit(1.0)  # status EOF can precede the exit becoming visible
            killed = self._restart()["signalled"]
            restarted = True
            if o.died and not o.timed_out:
                code, error = shell_death(rc, o.frame_error)
                error_code = "shell_died"
            elif error_code is None:
                error_code = "invalid_frame"
            error = join(
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
            stderr=stderr,
            stderr_bytes=errors.total if errors is not None else None,
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
