"""Background commands (``POST /exec`` with ``background: true``; issue 14 item 4).

A background command runs beside the persistent shell, never in it: a fresh ``bash -c``
in its own session and process group, with the environment the shell started with, in
the call's ``cwd`` (else the workspace), stdin from /dev/null, stdout and stderr joined.
The shell stays free for other calls meanwhile. ``POST /exec`` answers a handle at once;
``GET /exec/{id}?offset=N`` polls (status and the output from byte ``offset``);
``POST /exec/{id}/signal`` signals its process group.

Invariants a reader must not break:
* Each command's output goes through a pipe that one drain thread copies to
  ``RUN_DIR/bg/<id>.out``, at most ``cap`` bytes (the call's ``max_output_bytes``, else
  the job's ``--max-output-bytes``); the rest is counted in ``dropped_bytes``, so a
  chatty server can neither block on a full pipe nor fill the disk.
* The process is started through ``Reaper.spawn`` (the reaper never steals its exit
  status) and waited for by its own thread, which forgets it in the reaper afterwards.
* A command reads as ended only once its output pipe reached EOF (or 5 s after its exit,
  when a process it left behind holds the pipe), so a poll that says ``running: false``
  has everything the command itself wrote.
* Only a RUNNING command is signalled (its pid cannot have been reused: it is unreaped
  or still waited for); signalling a finished one is 409 ``not_running``.
* At most ``max_running`` run at once (429 beyond); finished records are kept up to
  ``max_kept`` (the oldest finished one, and its file, go first).
* ``kill_all`` (``/reset``, shutdown) kills every running group and waits for it.
"""

import os
import signal
import subprocess
import threading
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional

from .background_protocol import BackgroundHandle, BackgroundStatus, SignalAnswer
from .reaper import Reaper
from .wire import ApiError

READ_CHUNK = 1 << 16
POLL_MAX_BYTES = 1 << 20


class _Job(object):
    def __init__(self, ident: str, proc: "subprocess.Popen[bytes]", path: str, cap: int) -> None:
        self.id = ident
        self.proc = proc
        self.path = path
        self.cap = cap
        self.kept = 0
        self.total = 0
        self.started = time.monotonic()
        self.ended = None  # type: Optional[float]
        self.timed_out = False
        self.done = threading.Event()
        self.threads = []  # type: List[threading.Thread]


class Background:
    def __init__(
        self,
        bash: str,
        workspace: str,
        run_dir: str,
        env: Dict[str, str],
        reaper: Reaper,
        kill_grace: float,
        max_running: int = 32,
        max_kept: int = 64,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bash = bash
        self.workspace = workspace
        self.dir = os.path.join(run_dir, "bg")
        self.env = env
        self.reaper = reaper
        self.kill_grace = kill_grace
        self.max_running = max_running
        self.max_kept = max_kept
        self.clock = clock
        self._lock = threading.Lock()
        self._jobs = OrderedDict()  # type: OrderedDict[str, _Job]

    def start(self, command: str, cwd: str, timeout_s: Optional[float], cap: int) -> Dict[str, Any]:
        with self._lock:
            running = sum(1 for j in self._jobs.values() if j.ended is None)
            if running >= self.max_running:
                raise ApiError(
                    429,
                    "too_many_background",
                    "%d background commands are running; signal one or wait" % running,
                )
            self._evict()
            os.makedirs(self.dir, mode=0o700, exist_ok=True)
            ident = os.urandom(8).hex()
            env = dict(self.env)
            out_r, out_w = os.pipe()
            try:
                proc = self.reaper.spawn(
                    lambda: subprocess.Popen(
                        [self.bash, "--noprofile", "--norc", "-c", command],
                        stdin=subprocess.DEVNULL,
                        stdout=out_w,
                        stderr=out_w,
                        start_new_session=True,
                        cwd=cwd or self.workspace,
                        env=env,
                    )
                )
            except OSError as e:
                os.close(out_r)
                raise ApiError(400, "start_failed", "could not start bash: %s" % e) from None
            finally:
                os.close(out_w)
            job = _Job(ident, proc, os.path.join(self.dir, ident + ".out"), cap)
            self._jobs[ident] = job
        drain = threading.Thread(target=self._drain, args=(job, out_r), name="bg-out-" + ident)
        wait = threading.Thread(target=self._wait, args=(job, timeout_s), name="bg-wait-" + ident)
        job.threads = [drain, wait]
        for t in job.threads:
            t.daemon = True
            t.start()
        return BackgroundHandle(ident, proc.pid).to_json()

    def _drain(self, job: _Job, fd: int) -> None:
        with open(job.path, "wb", buffering=0) as out:
            while True:
                try:
                    data = os.read(fd, READ_CHUNK)
                except OSError:
                    break
                if not data:
                    break
                room = job.cap - job.kept
                if room > 0:
                    out.write(data[:room])
                    job.kept += min(room, len(data))
                job.total += len(data)
        os.close(fd)

    def _wait(self, job: _Job, timeout_s: Optional[float]) -> None:
        try:
            job.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            job.timed_out = True
            self._kill_group(job)
        finally:
            self.reaper.forget(job.proc.pid)
            # What it wrote before exiting is in the pipe: let the drain reach EOF before the
            # command reads as ended (bounded: a child it left behind may hold the pipe, and
            # what that child writes later still arrives).
            job.threads[0].join(5.0)
            job.ended = self.clock()
            job.done.set()

    def _kill_group(self, job: _Job) -> None:
        """SIGTERM the group, SIGKILL it after the grace; returns once the leader is
        reaped."""
        for sig, grace in ((signal.SIGTERM, self.kill_grace), (signal.SIGKILL, None)):
            try:
                os.killpg(job.proc.pid, sig)
            except OSError:
                pass
            try:
                job.proc.wait(grace)
                break
            except subprocess.TimeoutExpired:
                continue

    def poll(self, ident: str, offset: int, max_bytes: int) -> Dict[str, Any]:
        job = self._get(ident)
        running = job.ended is None
        kept = job.kept
        drained = not running and not job.threads[0].is_alive()
        with open(job.path, "rb") as f:
            f.seek(min(offset, kept))
            data = f.read(max(0, min(max_bytes, kept - offset)))
        if not drained or offset + len(data) < kept:
            data = _whole_characters(data)
        rc = job.proc.returncode
        return BackgroundStatus(
            id=job.id,
            pid=job.proc.pid,
            running=running,
            exit_code=None if running else (124 if job.timed_out else _exit_code(rc)),
            signal=-rc if (not running and rc is not None and rc < 0) else None,
            timed_out=job.timed_out,
            output=data.decode("utf-8", "replace"),
            offset=offset,
            next_offset=offset + len(data),
            output_bytes=job.total,
            dropped_bytes=job.total - job.kept,
            duration_ms=round(((job.ended or self.clock()) - job.started) * 1000.0, 3),
        ).to_json()

    def signal(self, ident: str, name: Any) -> Dict[str, Any]:
        job = self._get(ident)
        sig = _signal_number(name)
        with self._lock:
            if job.ended is not None or job.proc.poll() is not None:
                raise ApiError(409, "not_running", "background command %s has ended" % ident)
            try:
                os.killpg(job.proc.pid, sig)
            except ProcessLookupError:
                raise ApiError(409, "not_running", "its process group is gone") from None
        return SignalAnswer(ident, int(sig), job.proc.pid).to_json()

    def kill_all(self) -> List[int]:
        with self._lock:
            running = [j for j in self._jobs.values() if j.ended is None]
        for job in running:
            self._kill_group(job)
        for job in running:
            job.done.wait(self.kill_grace + 5.0)
        return [j.proc.pid for j in running]

    def _get(self, ident: str) -> _Job:
        with self._lock:
            job = self._jobs.get(ident)
        if job is None:
            raise ApiError(404, "unknown_command", "no background command %s" % ident)
        return job

    def _evict(self) -> None:
        finished = [k for k, j in self._jobs.items() if j.ended is not None]
        while len(finished) >= self.max_kept:
            job = self._jobs.pop(finished.pop(0))
            try:
                os.unlink(job.path)
            except OSError:
                pass


def _exit_code(rc: Optional[int]) -> Optional[int]:
    if rc is None:
        return None
    return 128 - rc if rc < 0 else rc  # bash's convention for a signal


def _signal_number(name: Any) -> int:
    if isinstance(name, int) and not isinstance(name, bool):
        number = name
    elif isinstance(name, str):
        text = name.upper()
        text = text if text.startswith("SIG") else "SIG" + text
        number = getattr(signal.Signals, text, 0) if text.isalnum() else 0
    else:
        number = 0
    valid = {int(s) for s in signal.Signals}
    if int(number) not in valid:
        raise ApiError(400, "bad_signal", "signal must be a name like INT or TERM, or a number")
    return int(number)


def _whole_characters(data: bytes) -> bytes:
    """``data`` without a UTF-8 character its end cuts in two (it comes next poll)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data
