"""The SIGCHLD handler must be safe to re-enter (a hang seen at execd's stop).

A Python signal handler runs in the main thread between two bytecodes, so a second
SIGCHLD can arrive while the first handler is still inside ``Reaper.notify``. When
``notify`` was ``threading.Event.set`` (which takes the event's lock), the second
handler waited for a lock its own thread held: execd hung and was killed at the end of
a test (faulthandler's dump showed ``notify`` inside ``notify`` in the main thread).

Here a child process installs ``notify`` as the handler of SIGUSR1 (standing in for
SIGCHLD), calls ``notify`` in a loop itself, and is showered with SIGUSR1 from a thread,
so handlers land inside ``notify`` many times. It must finish; a deadlock is caught by
the bound on the child's run (a bound on a hang, not on speed).
"""

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = textwrap.dedent(
    """
    import os, signal, threading
    from execd.procs import scan
    from execd.reaper import Reaper

    reaper = Reaper(scan)
    reaper.start(interval=60.0)
    signal.signal(signal.SIGUSR1, lambda _s, _f: reaper.notify())
    done = threading.Event()
    sent = [0]

    def shower():
        while not done.is_set():
            os.kill(os.getpid(), signal.SIGUSR1)
            sent[0] += 1

    t = threading.Thread(target=shower)
    t.start()
    for _ in range(200000):
        reaper.notify()
    done.set()
    t.join()
    reaper.stop()
    print("ok", sent[0])
    """
)


def test_notify_survives_being_reentered_by_its_own_signal_handler() -> None:
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    word, sent = proc.stdout.split()
    assert word == "ok" and int(sent) > 1000  # the handler really was showered
