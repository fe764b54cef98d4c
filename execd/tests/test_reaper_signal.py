"""The SIGCHLD handler must be safe to re-enter (a hang seen at execd's stop).

A Python signal handler runs in the main thread between two bytecodes, so a second
SIGCHLD can arrive while the first handler is still inside ``Reaper.notify``. When
``notify`` was ``threading.Event.set`` (which takes the event's lock), the second
handler waited for a lock its own thread held: execd hung and was killed at the end of
a test (faulthandler's dump showed ``notify`` inside ``notify`` in the main thread).

Here a child process installs ``notify`` as the handler of SIGUSR1 (standing in for
SIGCHLD), calls ``notify`` in a loop itself, and is showered with SIGUSR1 from a thread,
so handlers land inside ``notify``. The handler counts the landings whose interrupted
frame is ``notify``'s own, and the loop runs until there have been ``REENTRIES`` of them:
the work is counted in re-entries, not in calls, because how many calls it takes depends
on the machine (each wake-up makes the reaper scan /proc, and the three threads contend
for the GIL: a fixed 200,000 calls outran the bound on a loaded machine). It must finish;
a deadlock is caught by the bound on the child's run (a bound on a hang, not on speed).
"""

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = textwrap.dedent(
    """
    import os, signal, sys, threading
    from execd.procs import scan
    from execd.reaper import Reaper

    REENTRIES = int(sys.argv[1])
    reaper = Reaper(scan)
    reaper.start(interval=60.0)
    inside = [0]

    def handler(_s, frame):
        inside[0] += frame is not None and frame.f_code is Reaper.notify.__code__
        reaper.notify()

    signal.signal(signal.SIGUSR1, handler)
    done = threading.Event()
    sent = [0]

    def shower():
        while not done.is_set():
            os.kill(os.getpid(), signal.SIGUSR1)
            sent[0] += 1

    t = threading.Thread(target=shower)
    t.start()
    while inside[0] < REENTRIES:
        reaper.notify()
    done.set()
    t.join()
    reaper.stop()
    print("ok", sent[0], inside[0])
    """
)
REENTRIES = 200


def test_notify_survives_being_reentered_by_its_own_signal_handler() -> None:
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(REENTRIES)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    word, sent, inside = proc.stdout.split()
    assert word == "ok" and int(sent) > 1000  # the handler really was showered
    assert int(inside) >= REENTRIES  # and it landed inside notify that often
