"""One command's exchange with its shell: drain the output pipes until the status frame,
the shell's death or the deadline (``Shell`` builds the answer from the ``Outcome``).

Invariants a reader must not break:
* The status pipe and the shell's pidfd are always watched, so a frame or a death is
  seen at once; a deadline passes into ``timeouts.Timeout`` and is never missed.
* The output pipes are left unwatched for the first ``QUIET_S`` of a command: a short
  command's output then waits in the pipe (1 MiB) and is read with its frame, so
  execd wakes once per call instead of once for the output and once for the frame
  (a wake-up is a context switch on the critical path, dearer under load, and an
  ``isolate`` call's output always comes well before its frame). A command that
  fills the pipe within that window waits at most ``QUIET_S`` for it to be drained.
* Output is read into ``capture`` as it comes afterwards; held stream frames go out by
  their ``due`` time or with the final frame.
* Python 3.8, standard library only.
"""

import os
import select
from typing import Callable, Optional

from .bashproc import BashProcess
from .frames import FrameError, FrameParser, OutputCapture
from .outcome import Outcome
from .procs import ProcessTracker
from .timeouts import Timeout

QUIET_S = 0.002  # the output pipes are not watched this long after the command began


def exchange(
    proc: BashProcess,
    marker: str,
    deadline: float,
    since: int,
    capture: OutputCapture,
    read_size: int,
    errors: Optional[OutputCapture],
    tracker: ProcessTracker,
    kill_grace: float,
    clock: Callable[[], float],
) -> Outcome:
    """Drain output (stderr into ``errors``, or dropped) until the frame, death or deadline."""
    out = Outcome()
    parser = FrameParser(marker)
    quiet = [proc.status_r] + ([proc.pidfd] if proc.pidfd is not None else [])
    fds = quiet + [proc.out_r, proc.err_r]
    quiet_until = clock() + QUIET_S
    timeout = None  # type: Optional[Timeout]
    while True:
        now = clock()
        if timeout is None and now >= deadline:
            out.timed_out = True
            timeout = Timeout(tracker, kill_grace, clock, proc.pid, marker, since, now)
        wait = (deadline if timeout is None else timeout.next_step) - now
        if proc.pidfd is None:
            wait = min(wait, 0.05)  # no pidfd: poll for the shell's death
        if capture.due is not None:  # held stream frames: out by then, or with the frame
            wait = min(wait, capture.due - now)
        watched = fds
        if now < quiet_until:
            watched, wait = quiet, min(wait, quiet_until - now)
        ready = select.select(watched, [], [], max(wait, 0.0))[0]
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
        if capture.due is not None and clock() >= capture.due:
            capture.flush()
        if timeout is not None and timeout.step(clock()):
            out.gave_up = True
            break
    if timeout is not None:
        out.killed = sorted(timeout.signalled) if out.gave_up else timeout.finish()
    return out
