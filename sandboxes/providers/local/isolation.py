"""How a local sandbox is launched: bubblewrap namespaces, the sandbox user, cgroup entry.

Launch chain, isolated (provider running as root)::

    sh (root: writes its pid to the cgroup's cgroup.procs)
      -> setpriv (drops to the sandbox uid/gid, no groups)
        -> bwrap (user, mount, pid, ipc, uts, cgroup and net namespaces;
                  --die-with-parent --new-session --cap-drop ALL)
          -> python3 sandbox_init.py -> python3 -m execd -> bash -> commands

Why bwrap runs as the unprivileged host user and not as root with ``--uid``: a user
namespace created by root maps the sandbox user back to host uid 0, so every root-owned
file bound in (``/etc/shadow``) would be readable by its owner. Dropped first, the
sandbox's processes are host uid 65534 and see only what "other" may see.

Only what a sandbox needs is mounted (``/usr``, ``/etc``, the ``/bin`` ``/lib`` ``/lib64``
``/sbin`` symlinks, the interpreter, execd's source read-only, its own cgroup read-only,
the workspace read-write); ``/tmp`` and ``/run`` are fresh tmpfs. Host unix sockets live
elsewhere (``/run``, ``/tmp``, ``/var/run``), so they do not exist inside.

Invariants:
* Every host path a sandbox binds must be reachable by "other" (the sandbox uid has no
  other claim on it); :func:`unreachable` says which one is not, so ``auto`` can fall
  back and ``require`` can say why it refuses.
* The guards a record reports come from :func:`measure_guards`, which reads the
  namespaces and credentials of the running sandbox from /proc, not from the flags.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

INSIDE_WORKSPACE = "/workspace"
INSIDE_LIB = "/opt/sandman"
INSIDE_TOKEN = "/run/sandman/token"
INSIDE_RUN = "/run/sandman/execd"
INSIDE_STARTUP = f"{INSIDE_LIB}/startup.sh"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_ROOT_LINKS = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")
_NAMESPACES = ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")
# Writes its own pid into each cgroup.procs given before "--", then becomes the rest.
_ENTER_CGROUPS = (
    'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
)


@dataclass(frozen=True)
class Python:
    """The interpreter execd runs under, as the sandbox will call it."""

    path: str
    binds: tuple[str, ...] = ()  # host directories bound read-only at the same path


@dataclass(frozen=True)
class Launch:
    """Everything needed to start one sandbox's process chain."""

    argv: list[str]
    env: dict[str, str]
    cwd: str


def _query_python(executable: str) -> tuple[str, str, str]:
    done = subprocess.run(
        [
            executable,
            "-I",
            "-S",
            "-c",
            "import sys; print(sys.executable); print(sys.prefix); print(sys.base_prefix)",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    exe, prefix, base = done.stdout.strip().splitlines()[:3]
    return exe, prefix, base


def resolve_python(setting: str, isolated: bool) -> Python:
    """Resolve ``SANDMAN_EXECD_PYTHON`` for a plain process or for a sandbox.

    Isolated, a bare name is looked up the way the sandbox's PATH would find it, among
    the bound ``/usr`` directories (a host shim such as pyenv's would not exist inside).
    """
    if isolated and "/" not in setting:
        for directory in ("/usr/local/bin", "/usr/bin"):
            candidate = Path(directory) / setting
            real = os.path.realpath(candidate)
            if real.startswith("/usr/") and os.path.isfile(real) and os.access(real, os.X_OK):
                return Python(path=str(candidate))
        raise FileNotFoundError(f"{setting!r} is not in /usr/local/bin or /usr/bin")
    found = setting if "/" in setting else shutil.which(setting)
    if not found:
        raise FileNotFoundError(f"{setting!r} is not on PATH")
    exe, prefix, base = _query_python(found)
    if not isolated:
        return Python(path=exe)
    real = os.path.realpath(exe)
    if real.startswith("/usr/"):
        return Python(path=exe)
    binds = tuple(dict.fromkeys(p for p in (base, prefix) if not p.startswith("/usr/")))
    return Python(path=exe, binds=binds)


def unreachable(paths: list[Path], *, traverse_only: tuple[Path, ...] = ()) -> str | None:
    """The first path "other" cannot reach: search every ancestor, read the leaf.

    Paths in ``traverse_only`` need only be searchable (the sandbox root: a sandbox binds
    its own directory below it and never lists it).
    """
    for path in [*paths, *traverse_only]:
        path = Path(os.path.abspath(path))
        for ancestor in reversed(path.parents):
            if not os.stat(ancestor).st_mode & stat.S_IXOTH:
                return f"{ancestor} is not searchable by other users (needed for {path})"
        mode = os.stat(path).st_mode
        if path in traverse_only:
            need = stat.S_IXOTH
        else:
            need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
        if mode & need != need:
            return f"{path} is not readable by other users"
    return None


def _system_binds() -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _ROOT_LINKS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), f"/{name}"]
        elif host.is_dir():
            args += ["--ro-bind", str(host), f"/{name}"]
    return args + ["--ro-bind", "/etc", "/etc"]


def drop_privileges(uid: int, gid: int) -> list[str]:
    """Prefix that makes the rest run as uid/gid with no groups (only when we are root)."""
    if os.geteuid() != 0:
        return []
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--"]


def enter_cgroups(procs_files: tuple[str, ...], rest: list[str]) -> list[str]:
    if not procs_files:
        return rest
    return ["/bin/sh", "-c", _ENTER_CGROUPS, "sandman-launch", *procs_files, "--", *rest]


def sandbox_env(marker: str, home: str) -> dict[str, str]:
    return {"PATH": SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8", "SANDMAN_SANDBOX": marker}


def bwrap_launch(
    *,
    bwrap: str,
    name: str,
    marker: str,
    uid: int,
    gid: int,
    python: Python,
    execd_dir: Path,
    init_script: Path,
    workspace: Path,
    own_network: bool,
    cgroup_views: tuple[tuple[str, str], ...],
    procs_files: tuple[str, ...],
    fds: dict[str, int],
    startup: Path | None = None,
) -> Launch:
    """The argv that starts an isolated sandbox. ``fds``: token, ready, listen (own network),
    usernet_exit (egress allowed: only inherited, see usernet.py); ``startup``: the job's
    startup script (bound read-only, passed to execd)."""
    box = [
        bwrap,
        "--unshare-user",
        "--uid",
        str(uid),
        "--gid",
        str(gid),
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        name,
        "--die-with-parent",
        "--new-session",
        "--cap-drop",
        "ALL",
        "--clearenv",
    ]
    if own_network:
        box.append("--unshare-net")
    for key, value in sandbox_env(marker, "/tmp").items():
        box += ["--setenv", key, value]
    box += _system_binds()
    for prefix in python.binds:
        box += ["--ro-bind", prefix, prefix]
    box += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/run",
        "--ro-bind",
        str(execd_dir / "execd"),
        f"{INSIDE_LIB}/execd",
        "--ro-bind",
        str(init_script),
        f"{INSIDE_LIB}/sandbox_init.py",
    ]
    if startup is not None:
        box += ["--ro-bind", str(startup), INSIDE_STARTUP]
    for host_dir, inside in cgroup_views:
        box += ["--ro-bind", host_dir, inside]
    box += ["--bind", str(workspace), INSIDE_WORKSPACE, "--chdir", INSIDE_WORKSPACE, "--"]
    box += [
        python.path,
        "-I",
        "-S",
        f"{INSIDE_LIB}/sandbox_init.py",
        "--token-fd",
        str(fds["token"]),
        "--token-file",
        INSIDE_TOKEN,
        "--unlink-token",
        "--ready-fd",
        str(fds["ready"]),
        "--workspace",
        INSIDE_WORKSPACE,
        "--execd-dir",
        INSIDE_LIB,
        "--run-dir",
        INSIDE_RUN,
    ]
    if own_network:
        box += ["--listen-fd", str(fds["listen"])]
    if startup is not None:
        box += ["--startup-file", INSIDE_STARTUP]
    argv = enter_cgroups(procs_files, drop_privileges(uid, gid) + box)
    return Launch(argv=argv, env={"PATH": SANDBOX_PATH}, cwd="/")


def plain_launch(
    *,
    marker: str,
    python: Python,
    execd_dir: Path,
    init_script: Path,
    workspace: Path,
    private: Path,
    procs_files: tuple[str, ...],
    fds: dict[str, int],
    startup: Path | None = None,
) -> Launch:
    """The argv that starts a sandbox as plain host processes (isolation off)."""
    argv = [
        python.path,
        "-I",
        "-S",
        str(init_script),
        "--token-fd",
        str(fds["token"]),
        "--token-file",
        str(private / "token"),
        "--unlink-token",
        "--ready-fd",
        str(fds["ready"]),
        "--workspace",
        str(workspace),
        "--execd-dir",
        str(execd_dir),
        "--run-dir",
        str(private / "run"),
        # Without isolation /etc, /tmp and the system's package directories are the
        # host's, shared with every other program: a state restore there would delete or
        # rewrite their files. The state check covers only what is the sandbox's own (its
        # home; its repositories are found from the workspace).
        "--state-roots",
        str(private / "home"),
        "--site-packages",
        "",
        "--die-with-parent",
        str(os.getpid()),
    ]
    if startup is not None:
        argv += ["--startup-file", str(startup)]
    return Launch(
        argv=enter_cgroups(procs_files, argv),
        env=sandbox_env(marker, str(private / "home")),
        cwd=str(workspace),
    )


def probe_bwrap(bwrap: str | None, uid: int, gid: int) -> str | None:
    """None if bubblewrap can build a sandbox here, else the reason it cannot."""
    if not bwrap:
        return "bubblewrap (bwrap) is not installed"
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        return "setpriv is missing, so bwrap cannot be started as the sandbox user"
    argv = drop_privileges(uid, gid) + [
        bwrap,
        "--unshare-all",
        "--die-with-parent",
        "--new-session",
        "--uid",
        str(uid),
        "--gid",
        str(gid),
        "--cap-drop",
        "ALL",
        *_system_binds(),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--",
        "/usr/bin/true",
    ]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap could not run: {exc}"
    if done.returncode != 0:
        return f"bwrap failed: {done.stderr.strip()[:300]}"
    return None


def _ns(pid: int | str, kind: str) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return None


def _status(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/status") as handle:
            return dict(line.split(":", 1) for line in handle if ":" in line)
    except OSError:
        return {}


def measure_guards(pid: int) -> dict[str, object]:
    """Read which namespaces ``pid`` (a process inside the sandbox) does not share with us.

    Also reads its host uid and effective capabilities, as the kernel reports them.
    """
    guards: dict[str, object] = {}
    for kind in _NAMESPACES:
        theirs, ours = _ns(pid, kind), _ns("self", kind)
        key = "mount_ns" if kind == "mnt" else f"{kind}_ns"
        guards[key] = bool(theirs and ours and theirs != ours)
    status = _status(pid)
    if status:
        guards["host_uid"] = int(status["Uid"].split()[0])
        guards["cap_eff"] = status["CapEff"].strip()
    return guards
