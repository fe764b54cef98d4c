"""Where a stuck service process is: ``kill -USR1 <pid>`` prints every thread's Python
stack to the process's stderr, and it keeps running (``faulthandler``, standard library).

Installed by every service process at its start (``sandman_site.asgi``: each Daphne or
uvicorn worker; ``manage.py run_controller``). A crash (SIGSEGV, SIGABRT, SIGBUS, SIGFPE,
SIGILL) prints the same before the process dies. Neither Daphne nor uvicorn uses SIGUSR1.
"""

from __future__ import annotations

import faulthandler
import signal
import sys

DUMP_SIGNAL = signal.SIGUSR1


def enable_stack_dumps() -> None:
    """Idempotent. Both write to file descriptor 2 (``sys.__stderr__``, never a
    replacement of ``sys.stderr``); a process that enabled ``faulthandler`` already (pytest,
    ``PYTHONFAULTHANDLER``) keeps its own choice for crashes."""
    stderr = sys.__stderr__
    if stderr is None:  # no stderr at all (pythonw-like): nowhere to print
        return
    if not faulthandler.is_enabled():
        faulthandler.enable(file=stderr, all_threads=True)
    faulthandler.register(DUMP_SIGNAL, file=stderr, all_threads=True, chain=False)
