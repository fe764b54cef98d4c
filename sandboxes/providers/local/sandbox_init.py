"""The first process of a local sandbox: starts execd, reports its address, reaps.

Runs under the sandbox's own Python (standard library only, importable on 3.8), inside
bubblewrap when isolation is on and as a plain child of the provider when it is off.
The provider talks to it through three inherited file descriptors:

* ``--token-fd``: a pipe holding the sandbox token. It is written to ``--token-file``
  (mode 0400) only for execd to read at start-up, and unlinked once execd is listening
  when ``--unlink-token`` is given, so a command cannot read it from the file system.
* ``--ready-fd``: one line goes back, ``listening on HOST:PORT`` or ``failed: REASON``,
  then the descriptor is closed.
* ``--listen-fd`` (every isolated sandbox): a TCP socket the provider created and
  bound in the HOST network namespace. The sandbox itself lives in an empty network
  namespace, so a port execd bound there would be unreachable from the host; execd
  accepts on the host socket itself instead (``execd --listen-fd``), and this process
  closes its own copy once execd is forked. A listening socket can only accept, never
  connect, so it gives execd no way out, and execd makes it close-on-exec, so no command
  gets it (an earlier form relayed each connection through a thread here: two more
  threads and hops per connection, 0.4-0.6 ms of a new connection's health check on a
  quiet machine, ``bench/local_connect.py``).

Invariants a reader must not break:
* Without bubblewrap (whose --die-with-parent covers it), ``--die-with-parent`` makes the
  provider's death a SIGTERM here, so plain sandboxes end with the provider as isolated
  ones do; a restarted provider's ``list_owned`` still finds their directories.
* This process is a child subreaper: orphans of execd's commands (``setsid``, double
  fork) are re-parented here, never to the host's PID 1, which does not reap.
* On SIGTERM, or when execd exits, every descendant is SIGKILLed and reaped BEFORE this
  process exits, so nothing the sandbox started outlives it as a process or a zombie.
* The token never goes into an environment variable or a command line. This process is
  not dumpable and execd is forked from it (``runpy``, no new interpreter), so neither
  process's memory can be read by a command running as the same uid.
"""

import argparse
import ctypes
import os
import runpy
import signal
import sys
import threading
import traceback

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_NAME = 15
PR_SET_CHILD_SUBREAPER = 36


class _Terminate(Exception):
    pass


def _on_sigterm(signum, frame):
    # Once only: the provider's death can bring several SIGTERMs (PR_SET_PDEATHSIG follows
    # the THREAD that spawned us; as each of its threads dies we are re-parented to the
    # next and signalled again), and a second _Terminate raised in main's clean-up would
    # cut it short, leaving execd running.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise _Terminate()


def _prctl(option, value):
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def _write_token(path, token):
    directory = os.path.dirname(path)
    if directory and not os.path.isdir(directory):
        os.makedirs(directory, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o400)
    try:
        os.write(fd, token)
    finally:
        os.close(fd)


def _report(ready_fd, line):
    if ready_fd is None:
        return
    try:
        os.write(ready_fd, (line.strip() + "\n").encode("utf-8", "replace"))
    except OSError:
        pass


def _children_map():
    """pid -> ppid for every process this /proc shows (zombies excluded)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        rest = stat[stat.rfind(b")") + 2 :].split()
        if rest and rest[0] not in (b"Z", b"X"):
            parents[int(entry)] = int(rest[1])
    return parents


def _descendants(root):
    parents = _children_map()
    found = set()
    frontier = [root]
    while frontier:
        current = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == current and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return found


def _kill_everything_and_reap():
    """SIGKILL every live descendant until none is left, then reap all children."""
    me = os.getpid()
    for _ in range(1000):
        alive = _descendants(me)
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap_nowait()
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            return
        except InterruptedError:
            continue


def _reap_nowait():
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _drain(stream, sink_fd):
    for line in iter(stream.readline, b""):
        try:
            os.write(sink_fd, line)
        except OSError:
            pass


def _parse_listening(line):
    text = line.decode("utf-8", "replace").strip()
    prefix = "listening on "
    if not text.startswith(prefix):
        return None
    host, _, port = text[len(prefix) :].rpartition(":")
    if not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def _arguments(argv):
    parser = argparse.ArgumentParser(prog="sandbox_init")
    parser.add_argument("--token-fd", type=int, required=True)
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--unlink-token", action="store_true")
    parser.add_argument("--ready-fd", type=int, required=True)
    parser.add_argument("--listen-fd", type=int)
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--execd-dir", required=True, help="the directory holding execd/")
    parser.add_argument("--run-dir", help="execd's private directory for command files")
    parser.add_argument("--state-roots", help="passed to execd (the state check's roots)")
    parser.add_argument("--site-packages", help="passed to execd ('' scans none)")
    parser.add_argument("--startup-file", help="passed to execd (the job's startup script)")
    parser.add_argument(
        "--die-with-parent", type=int, metavar="PID", help="get SIGTERM when PID (our parent) dies"
    )
    return parser.parse_args(argv)


def _run_execd_here(args, stdout_fd):
    """In the forked child: become ``python3 -m execd ...`` without a new interpreter.

    Forking saves an interpreter start, and the child keeps this process's
    non-dumpable flag (only execve resets it), so commands cannot read the token from
    execd's memory either. Never returns.
    """
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _prctl(PR_SET_NAME, b"execd")  # what ps -o comm and top show; argv stays ours
        os.dup2(stdout_fd, 1)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        keep = 3  # the host socket, if any, at a known number; execd makes it close-on-exec
        if args.listen_fd is not None and args.listen_fd != keep:
            os.dup2(args.listen_fd, keep)
        os.closerange(keep if args.listen_fd is None else keep + 1, _max_fd())
        os.chdir(args.execd_dir)
        sys.path.insert(0, args.execd_dir)
        if args.listen_fd is None:
            sys.argv = ["execd", "--port", "0"]
        else:
            sys.argv = ["execd", "--listen-fd", str(keep)]
        sys.argv += ["--token-file", args.token_file]
        sys.argv += ["--workspace", args.workspace]
        if args.run_dir:
            sys.argv += ["--run-dir", args.run_dir]
        if args.state_roots is not None:
            sys.argv += ["--state-roots", args.state_roots]
        if args.site_packages is not None:
            sys.argv += ["--site-packages", args.site_packages]
        if args.startup_file:
            sys.argv += ["--startup-file", args.startup_file]
        runpy.run_module("execd", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            sys.stderr.write(f"{exc.code}\n")
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _max_fd():
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        return 65536


def _start_execd(args):
    """Fork execd; return (pid, a binary reader of its stdout)."""
    if args.run_dir:
        os.makedirs(args.run_dir, mode=0o700, exist_ok=True)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        _run_execd_here(args, write_end)
    os.close(write_end)
    if args.listen_fd is not None:
        os.close(args.listen_fd)  # execd's alone now: it closes when execd ends
    return pid, os.fdopen(read_end, "rb")


def main(argv=None):
    args = _arguments(sys.argv[1:] if argv is None else argv)
    signal.signal(signal.SIGTERM, _on_sigterm)
    # Commands run as our uid: without this they could read the token from our memory
    # (/proc/<pid>/mem). execd is forked, not exec'd, so it inherits the flag; the shell
    # and commands are exec'd, which resets it for them.
    _prctl(PR_SET_DUMPABLE, 0)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    if args.die_with_parent:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != args.die_with_parent:  # it died before the prctl took effect
            return 0
    ready_fd = args.ready_fd
    execd = None
    try:
        _write_token(args.token_file, _read_all(args.token_fd))
        execd, execd_stdout = _start_execd(args)
        first = execd_stdout.readline()
        address = _parse_listening(first)
        if address is None:
            _report(ready_fd, f"failed: execd said {first[:200]!r} before listening")
            return 3
        threading.Thread(target=_drain, args=(execd_stdout, 2), daemon=True).start()
        if args.unlink_token:
            os.unlink(args.token_file)
        # With --listen-fd, execd accepts on the host socket itself and says so: the
        # socket's last holder is execd, so it closes when execd ends.
        _report(ready_fd, f"listening on {address[0]}:{address[1]}")
        os.close(ready_fd)
        ready_fd = None
        while True:
            pid, _ = os.waitpid(-1, 0)
            if pid == execd:
                return 0
    except _Terminate:
        return 0
    except ChildProcessError:
        return 0
    except OSError as exc:
        _report(ready_fd, f"failed: {exc}")
        return 4
    finally:
        try:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        except _Terminate:  # the first SIGTERM, just now: the handler ignores the rest
            pass
        _kill_everything_and_reap()


if __name__ == "__main__":
    sys.exit(main())
