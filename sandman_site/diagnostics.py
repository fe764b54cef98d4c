"""Where a stuck service process is: ``kill -USR1 <pid>`` prints every thread's Python
stack, with the threads' names, to the process's stderr, and it keeps running.

Installed by every service process at its start (``sandman_site.asgi``: each Daphne or
uvicorn worker; ``manage.py run_controller``). Neither Daphne nor uvicorn uses SIGUSR1.

The dump is a Python signal handler (``sys._current_frames``), run by the main thread
between two bytecodes with the interpreter lock held: it reads a consistent list of
threads. ``faulthandler.register(..., all_threads=True)`` was tried first and crashed a
Daphne replica once in CI (a fatal-error dump right after its own), as it walks the thread
states from inside the C signal handler while other threads start and end. A crash
(SIGSEGV, SIGABRT, ...) still prints every thread's stack through ``faulthandler.enable``.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
import traceback
from types import FrameType

DUMP_SIGNAL = signal.SIGUSR1
END = "-- end of stacks --"  # the dump's last line: a reader knows it has all of it


def stacks() -> str:
    """Every thread's stack, each under its name, as one text."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = [f"stacks of process {os.getpid()} (most recent call last):\n"]
    for ident, top in sys._current_frames().items():
        parts.append(f"\nthread {names.get(ident, '?')!r} ({ident:#x}):\n")
        parts.extend(traceback.format_stack(top))
    parts.append(END + "\n")
    return "".join(parts)


def _dump(signum: int, frame: FrameType | None) -> None:
    stderr = sys.__stderr__
    if stderr is not None:
        stderr.write(stacks())
        stderr.flush()


def enable_stack_dumps() -> None:
    """Idempotent; in the main thread only (a signal handler can be set nowhere else: a
    call from another thread does nothing). Crashes go to file descriptor 2 unless the
    process enabled ``faulthandler`` already (pytest, ``PYTHONFAULTHANDLER``)."""
    if threading.current_thread() is not threading.main_thread():
        return
    stderr = sys.__stderr__
    if stderr is not None and not faulthandler.is_enabled():
        faulthandler.enable(file=stderr, all_threads=True)
    signal.signal(DUMP_SIGNAL, _dump)
