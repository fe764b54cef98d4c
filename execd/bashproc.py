"""One persistent bash process and its three pipes.

How a command reaches bash (no fork per command, nothing spliced into the
protocol):

1. execd overwrites two files in its private run directory with ``pwrite``
   (an O_TRUNC open costs ~170 us on ext4; pwrite+ftruncate ~5 us):
   ``command`` holds the command text verbatim, ``check`` the same text inside
   a never-executed wrapper (``frames.check_wrapper``).
2. execd writes one short control line to bash's script pipe:
   ``__sm_m=<marker> __sm_c=<cwd>;\\builtin eval "$__sm_drive"``. bash reads
   its script from that pipe, so the user's text never travels on it and an
   open quote or heredoc cannot swallow the protocol.
3. ``$__sm_drive`` (readonly; the work is in readonly functions, so bash
   parses ~200 bytes per command) sources ``check`` - a pure parse, ~15 us,
   no fork, with extglob on so a command that enables it on its first line
   still parses: a syntax error (open quote, unterminated heredoc) fails it
   and bash's diagnostic is captured in ``check.err`` - then cds to the cwd if
   one was asked for, and sources ``command`` at top level (so ``declare``
   stays global) with stdin from /dev/null, stderr joined to stdout (the output
   pipe; ``stderr: "separate"``: the stderr pipe, fd 43) and the status fd
   closed (``isolate``: sources it in a subshell instead, so the call cannot
   change the shell's state). A cwd given for the call is left again after it
   (the shell's own directory is kept), and notices of jobs that ended since
   the last command are consumed before it starts, so they never reach the
   output of a later command.
4. It then writes ``<marker> <kind> <status>\\n`` with ``\\builtin printf`` to
   the status pipe (fd 40). Output and status never share a channel.

The shell runs with job control (``set -m``), so every pipeline the command
starts gets its own process group; timeouts kill those groups. bash is made a
child subreaper before it execs, so a process a command orphans (double fork,
setsid) is re-parented to that session's shell and stays in its process tree:
commands carry no marker variable of execd's in their environment. SIGINT is
trapped as a no-op in the shell, so an interrupt of the foreground job
(``sessions.py``) does not end the shell; bash then abandons the rest of the
command's line, and ``recover_line`` writes the frame the driver did not. A timed-out
command is also stopped inside the shell: the SIGURG trap (a no-op between
commands) returns 124 and installs a DEBUG trap (with functrace) that returns
again before any further command, so it unwinds every function level and then
the sourced file without running another line of it. (A user's own DEBUG trap
is dropped when its command times out, and a user who traps SIGURG themselves
loses this: the timeout then restarts the shell.)

Invariants: fd 40 (status) and the script pipe are never inherited by
commands' exec'd programs; every builtin the driver calls is spelled
``\\builtin NAME`` so user functions or aliases named ``printf``, ``source``
or ``cd`` cannot hijack it; only a function named ``builtin`` itself can, and
the strict frame parser turns that into an error plus a shell restart.
"""

import array
import fcntl
import mmap
import os
import select
import shlex
import subprocess
import termios
import threading
from typing import Dict, Optional

from .frames import OutputCapture, check_wrapper
from .procs import Cgroup, pidfd_open, subreaper_setter
from .reaper import Reaper

STATUS_FD = 40
NULL_FD = 42  # /dev/null, opened once: a dup is cheaper than an open per command
ERR_FD = 43  # the stderr pipe of ``stderr: "separate"`` calls
F_SETPIPE_SZ = 1031
READ_CHUNK = 1 << 20

# Defined once and readonly, so bash parses them once, not per command.
# __sm_pre runs the syntax check and the cd, writing the frame itself if either
# fails; the flag juggling (e, u, x, posix must be off while the driver runs and
# back on for the command) is skipped when none is set, the common case. xtrace
# stays off between commands (remembered in __sm_x) so the control line is
# never traced into a command's output.
_FUNCTIONS = r"""__sm_off() {
__sm_f=
if [[ $- == *[eux]* || -n $__sm_x || :$SHELLOPTS: == *:posix:* ]]; then
__sm_f=$-$__sm_x; [[ :$SHELLOPTS: == *:posix:* ]] && __sm_f+=P
\builtin set +eux +o posix
fi
}
__sm_restore() {
if [[ -n $__sm_f ]]; then
[[ $__sm_f == *P* ]] && \builtin set -o posix
[[ $__sm_f == *u* ]] && \builtin set -u
[[ $__sm_f == *x* ]] && \builtin set -x
[[ $__sm_f == *e* ]] && \builtin set -e
fi
\builtin :
}
__sm_pre() {
__sm_a=; __sm_off
\builtin jobs -n >/dev/null 2>&1
if \builtin shopt -q extglob; then __sm_g=; else __sm_g=1; \builtin shopt -s extglob; fi
\builtin source "$__sm_d/check" 2>&42; __sm_r=$?
if [[ $__sm_r != 0 ]]; then
\builtin source "$__sm_d/check" 2>|"$__sm_d/check.err"
[[ -n $__sm_g ]] && \builtin shopt -u extglob
\builtin printf '%s s %d\n' "$__sm_m" "$__sm_r" >&40; __sm_restore; \builtin return 1
fi
[[ -n $__sm_g ]] && \builtin shopt -u extglob
[[ -n $__sm_c ]] && __sm_o=$PWD __sm_p=$OLDPWD
if [[ -n $__sm_c ]] && ! \builtin cd -- "$__sm_c" 2>|"$__sm_d/check.err"; then
\builtin printf '%s c 1\n' "$__sm_m" >&40; __sm_restore; \builtin return 1
fi
__sm_in=1; __sm_restore
}
__sm_post() {
__sm_in=
[[ -n $__sm_a && $__sm_t != *T* ]] && \builtin set +T
__sm_off
[[ -n $__sm_c ]] && { \builtin cd -- "$__sm_o"; OLDPWD=$__sm_p; }
\builtin printf '%s x %d\n' "$__sm_m" "$__sm_r" >&40
__sm_x=; [[ $__sm_f == *x* ]] && __sm_x=x
__sm_f=${__sm_f//x/}; __sm_restore
}
readonly -f __sm_off __sm_restore __sm_pre __sm_post
readonly __sm_unwind='[[ -n $__sm_a ]] && (( ${#BASH_SOURCE[@]} > 1 )) && \builtin return 124'
\builtin trap '[[ -n $__sm_in ]] && { __sm_a=1 __sm_t=$-; \builtin set -T;
\builtin trap "$__sm_unwind" DEBUG; \builtin return 124; }' URG
\builtin trap '\builtin :' INT"""

# The per-command text ``eval`` parses: the user's file is sourced here, at top
# level, never inside a function (where ``declare`` would make locals), with
# stdin from /dev/null, stderr joined to stdout (the output pipe unless the
# command itself redirected it with exec) and the status fd closed.
_DRIVE = (
    r"""{ __sm_pre && { \builtin source "$__sm_d/command" 2>&$__sm_2 <&42 40>&- 42>&- 43>&-;"""
    r""" __sm_r=$?; [[ -z $__sm_a ]] || \builtin trap - DEBUG; __sm_post; }; } 2>&42;"""
    r""" \builtin :"""
)
# ``isolate``: the same file sourced in a subshell, which sees the shell's variables,
# functions and cwd but cannot change them; ``exit`` or ``set -e`` ends the subshell only.
_DRIVE_ISOLATED = _DRIVE.replace(
    r"""\builtin source "$__sm_d/command" 2>&$__sm_2""",
    r"""( \builtin source "$__sm_d/command" ) 2>&$__sm_2""",
)

# Test hook only (--test-hooks): the status fd stays open inside the command,
# so a test can write forged, empty or cut-off frames (Table A25, forced cases).
_DRIVE_EXPOSED = _DRIVE.replace(" 40>&-", "")
_DRIVE_ISOLATED_EXPOSED = _DRIVE_ISOLATED.replace(" 40>&-", "")


# Run in the forked child before bash execs (only a prctl: no allocation, no lock).
_SUBREAPER = subreaper_setter()


def _fionread(fd: int) -> int:
    n = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, n)
    return n[0]


class BashProcess:
    """A running bash plus its pipes; replaced as a whole on restart."""

    def __init__(
        self,
        bash: str,
        workspace: str,
        run_dir: str,
        session: str,
        env: Dict[str, str],
        reaper: Reaper,
        cgroup: Optional[Cgroup],
        test_hooks: bool,
    ) -> None:
        self.run_dir = run_dir
        self._cmd_path = os.path.join(run_dir, "command")  # what ``scrub`` replaces
        self._cmd_path_b = self._cmd_path.encode()
        script_r, self._script_w = os.pipe()
        self.status_r, status_w = os.pipe()
        self.out_r, out_w = os.pipe()
        self.err_r, err_w = os.pipe()
        for fd in (self.out_r, self.err_r):
            try:
                fcntl.fcntl(fd, F_SETPIPE_SZ, READ_CHUNK)
            except OSError:
                pass  # the default 64 KiB pipe works, only with more wakeups
            os.set_blocking(fd, False)
        self._cmd_fd = os.open(os.path.join(run_dir, "command"), os.O_RDWR | os.O_CREAT, 0o600)
        self._chk_fd = os.open(os.path.join(run_dir, "check"), os.O_RDWR | os.O_CREAT, 0o600)
        child_env = dict(env)
        argv = [bash, "--noprofile", "--norc", "/dev/fd/%d" % script_r]
        self.proc = reaper.spawn(
            lambda: subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out_w,
                stderr=out_w,
                pass_fds=(script_r, status_w, err_w),
                start_new_session=True,
                cwd=workspace,
                env=child_env,
                preexec_fn=_SUBREAPER,
            )
        )  # type: subprocess.Popen
        self.pid = self.proc.pid
        for fd in (script_r, status_w, out_w, err_w):
            os.close(fd)
        if cgroup is not None:
            cgroup.add(self.pid)  # bash is still blocked reading its script: nothing escaped
        self.pidfd = pidfd_open(self.pid)
        self._buf = mmap.mmap(-1, READ_CHUNK)  # anonymous: pages cost RSS only once written
        self._io_lock = threading.Lock()
        self._active = False  # a command owns the output pipe
        self._closing = False
        self._wake_r, self._wake_w = os.pipe()
        self._write_init(script_r, status_w, err_w, workspace, session, test_hooks)
        threading.Thread(target=self._drain_idle, name="drain-%d" % self.pid, daemon=True).start()

    def _write_init(
        self, script_r: int, status_w: int, err_w: int, workspace: str, session: str, hooks: bool
    ) -> None:
        q = shlex.quote
        lines = [
            "exec %d<&- %d>&%d %d>&- %d<>/dev/null %d>&%d %d>&-"
            % (script_r, STATUS_FD, status_w, status_w, NULL_FD, ERR_FD, err_w, err_w),
            "BASH_ARGV0=bash",
            "\\builtin cd -- %s || exit 97" % q(workspace),
            "readonly __sm_d=%s __sm_s=%s" % (q(self.run_dir), q(session)),
            _FUNCTIONS,
            "readonly __sm_drive=%s" % q(_DRIVE),
            "readonly __sm_drive_t=%s" % q(_DRIVE_EXPOSED if hooks else _DRIVE),
            "readonly __sm_drive_i=%s" % q(_DRIVE_ISOLATED),
            "readonly __sm_drive_ti=%s" % q(_DRIVE_ISOLATED_EXPOSED if hooks else _DRIVE_ISOLATED),
            "set -m",
            "",
        ]
        self.send("\n".join(lines))

    # -- command I/O -------------------------------------------------------

    def send(self, text: str) -> None:
        """Raises BrokenPipeError when bash is gone."""
        os.write(self._script_w, text.encode())

    def stage(self, command: str) -> None:
        for fd, text in ((self._cmd_fd, command), (self._chk_fd, check_wrapper(command))):
            data = text.encode("utf-8", "surrogateescape")
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))

    def control_line(
        self,
        marker: str,
        cwd: str,
        expose_status_fd: bool,
        isolate: bool = False,
        separate_stderr: bool = False,
    ) -> str:
        drive = "__sm_drive_" + ("t" if expose_status_fd else "") + ("i" if isolate else "")
        drive = drive.rstrip("_")
        return '__sm_m=%s __sm_c=%s __sm_2=%d;\\builtin eval "$%s"\n' % (
            marker,
            shlex.quote(cwd) if cwd else "",
            ERR_FD if separate_stderr else 1,
            drive,
        )

    @staticmethod
    def recover_line() -> str:
        """Sent after an interrupt: when bash abandoned the command's line (its foreground
        job died of SIGINT) the driver is still inside the command, so this line ends it
        as ``__sm_post`` would, with status 130; after a command that ended normally it
        does nothing. bash reads it only once the current line is done."""
        return "[[ -n $__sm_in ]] && { __sm_r=130; __sm_post; }; \\builtin :\n"

    def begin(self) -> None:
        """Keep the idle drainer off the pipe and drop output that arrived between
        commands."""
        with self._io_lock:
            self._active = True
            self.read_pending(None)
            self.read_pending(None, self.err_r)

    def end(self) -> None:
        self._active = False

    def read_output(
        self, capture: Optional[OutputCapture], limit: int = READ_CHUNK, fd: int = -1
    ) -> int:
        """One non-blocking read (of the output pipe, or ``fd``) into ``capture`` (None:
        drop it); returns the bytes read, 0 when there was nothing."""
        try:
            n = os.readv(
                self.out_r if fd < 0 else fd, [memoryview(self._buf)[: min(limit, READ_CHUNK)]]
            )
        except BlockingIOError:
            return 0
        if n > 0 and capture is not None:
            capture.feed(memoryview(self._buf)[:n])
        return n

    def read_pending(self, capture: Optional[OutputCapture], fd: int = -1) -> None:
        """Read what is in the output pipe (or ``fd``) now (all a finished command wrote),
        but not what background writers add meanwhile."""
        pending = _fionread(self.out_r if fd < 0 else fd)
        while pending > 0:
            n = self.read_output(capture, pending, fd)
            if n <= 0:
                break
            pending -= n

    def status_pending(self) -> int:
        return _fionread(self.status_r)

    def scrub(self, text: str) -> str:
        """Bash names the sourced command file in its messages and ``$BASH_SOURCE``; say
        ``bash`` there, as ``bash -c`` does, so execd's private path never shows."""
        return text.replace(self._cmd_path, "bash")

    def scrub_bytes(self, data: "bytes | memoryview") -> bytes:
        """``scrub`` for streamed output chunks (a path split across two chunks stays);
        one copy out of the read buffer (``replace`` returns it as is when no path is in
        it)."""
        return bytes(data).replace(self._cmd_path_b, b"bash")

    def check_error(self) -> str:
        path = os.path.join(self.run_dir, "check.err")
        try:
            with open(path, "rb") as f:
                text = f.read(8192).decode("utf-8", "replace")
        except OSError:
            return ""
        return text.replace(os.path.join(self.run_dir, "check"), "bash").strip()

    def poll_exit(self) -> Optional[int]:
        return self.proc.poll()

    def wait_exit(self, timeout: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    # -- lifetime ----------------------------------------------------------

    def _drain_idle(self) -> None:
        """Between commands, read and drop what background processes print, so a
        chatty server never blocks on a full pipe. It wakes once a second rather
        than on every write: a command's own output must not wake this thread."""
        while True:
            try:
                ready = select.select([self._wake_r], [], [], 1.0)[0]
            except (OSError, ValueError):
                break
            if ready or self._closing:
                break
            with self._io_lock:
                if self._active or self._closing:
                    continue
                try:
                    self.read_pending(None)
                    self.read_pending(None, self.err_r)
                except OSError:
                    break
        os.close(self._wake_r)

    def close(self, reaper: Reaper) -> Optional[int]:
        """Close pipes and wait for bash (the caller has killed it or it died)."""
        self._closing = True
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        try:
            rc = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        reaper.forget(self.pid)
        with self._io_lock:
            fds: "list[int]" = [
                self._script_w,
                self.status_r,
                self.out_r,
                self.err_r,
                self._cmd_fd,
                self._chk_fd,
                self._wake_w,
            ]
            if self.pidfd is not None:
                fds.append(self.pidfd)
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._buf.close()
        return rc
