"""What one command's exchange with the shell came to, and the exit code, error and
error code an answer says for it (``shell.Shell`` builds the answer from these).

Invariant: an exit code comes only from a valid frame, from execd's own timeout (124)
or from the shell's death (bash's convention, 128 + signal); anything else is -1 with
an error saying why - never a guessed status.
"""

from typing import TYPE_CHECKING, List, Optional, Tuple  # noqa: F401 (type comments)

if TYPE_CHECKING:  # names used in annotations only
    from .bashproc import BashProcess
    from .frames import Frame


class Outcome(object):
    def __init__(self) -> None:
        self.frame: Optional["Frame"] = None
        self.frame_error = None  # type: Optional[str]
        self.died = False
        self.timed_out = False
        self.gave_up = False
        self.killed = []  # type: List[int]


def classify(
    o: Outcome, proc: "BashProcess", timeout_s: float
) -> Tuple[int, Optional[str], Optional[str]]:
    """Exit code, error and error code from the frame, the timeout or a bad frame (the
    caller adds what an interrupt, a reset, a shutdown or a shell death changes)."""
    code, error, error_code = -1, None, None  # type: int, Optional[str], Optional[str]
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
            error_code = "syntax_error"
        elif o.frame.kind == "c":
            error = "cd failed: %s" % (proc.check_error() or "cwd is not usable")
            error_code = "cwd_failed"
    elif o.frame_error is not None and not o.died:
        error = "invalid status frame (%s)" % o.frame_error
        error_code = "invalid_frame"
    return code, error, error_code


def join(first: Optional[str], second: str) -> str:
    return first + "; " + second if first else second


def shell_death(rc: Optional[int], frame_error: Optional[str]) -> Tuple[int, str]:
    """Exit code and error for a shell that died during a command (bash convention:
    128 + signal number when killed)."""
    if rc is None:
        return -1, "the shell closed its status channel"
    how = "was killed by signal %d" % -rc if rc < 0 else "exited with status %d" % rc
    detail = " (%s)" % frame_error if frame_error else ""
    return (128 - rc if rc < 0 else rc), "the shell %s%s" % (how, detail)


class Busy(Exception):
    """Another command is running in the shell."""
