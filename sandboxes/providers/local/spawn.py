"""Starting one local sandbox's process chain, and what the provider keeps about it.

Invariants:
* ``spawn`` is called from the event loop's thread (see provider.py: bubblewrap's
  --die-with-parent follows the spawning thread).
* The token reaches the sandbox's first process only through a pipe; no host-side file,
  argv or environment variable holds it.
* Every descriptor made here is closed here, in the parent, whatever happens; only the
  ready pipe's read end survives, owned by the returned ``Live``.
"""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from sandboxes.providers.base import SandboxSpec
from sandboxes.providers.local import cgroups, isolation
from sandboxes.providers.local.runtime import INIT_SCRIPT, Runtime


@dataclass
class Live:
    """A sandbox this provider instance started: the child to reap, the ready pipe."""

    popen: subprocess.Popen[bytes]
    ready_fd: int | None
    timeline: dict[str, dt.datetime] = field(default_factory=dict)
    # egress-allowed isolated sandboxes: the exit pipe's read end until slirp4netns takes
    # it (usernet.py), then slirp4netns itself, which teardown reaps
    usernet_exit: int | None = None
    usernet: subprocess.Popen[bytes] | None = None


@dataclass(frozen=True)
class Plan:
    """Host facts ``spawn`` needs besides the spec."""

    runtime: Runtime
    directory: Path
    placement: cgroups.Placement | None
    bwrap: str
    uid: int
    gid: int
    execd_dir: Path
    marker: str  # SANDMAN_SANDBOX in the sandbox's environment


def _launch(spec: SandboxSpec, plan: Plan, fds: dict[str, int]) -> isolation.Launch:
    procs_files = plan.placement.procs_files if plan.placement else ()
    startup = None
    if spec.startup_script:  # read once by execd at its start
        startup = plan.directory / "startup.sh"  # beside the workspace: the sandbox user reads it
        startup.write_text(spec.startup_script, encoding="utf-8")
        startup.chmod(0o644)  # the sandbox's user reads it
    if plan.runtime.isolated:
        return isolation.bwrap_launch(
            bwrap=plan.bwrap,
            name=spec.name,
            marker=plan.marker,
            uid=plan.uid,
            gid=plan.gid,
            python=plan.runtime.python,
            execd_dir=plan.execd_dir,
            init_script=INIT_SCRIPT,
            workspace=plan.directory / "workspace",
            own_network=True,
            cgroup_views=plan.placement.views if plan.placement else (),
            procs_files=procs_files,
            fds=fds,
            startup=startup,
        )
    private = plan.directory / "private"
    (private / "home").mkdir(mode=0o700, exist_ok=True)
    return isolation.plain_launch(
        marker=plan.marker,
        python=plan.runtime.python,
        execd_dir=plan.execd_dir,
        init_script=INIT_SCRIPT,
        workspace=plan.directory / "workspace",
        private=private,
        procs_files=procs_files,
        fds=fds,
        startup=startup,
    )


def spawn(spec: SandboxSpec, plan: Plan, now: dt.datetime) -> Live:
    """Start the chain. Isolated, every sandbox has its own network namespace (egress
    denied: nothing more; allowed: slirp4netns is attached once execd listens, usernet.py)."""
    own_network = plan.runtime.isolated
    token_r, token_w = os.pipe()
    ready_r, ready_w = os.pipe()
    exit_r = exit_w = -1
    listener = None
    log_fd = -1
    try:
        os.write(token_w, spec.token.encode())  # a token is far below a pipe's capacity
        fds = {"token": token_r, "ready": ready_w}
        if own_network and spec.egress != "deny":
            exit_r, exit_w = os.pipe()  # the write end lives only in the sandbox's chain
            fds["usernet_exit"] = exit_w
        if own_network:
            # Bound in the HOST network namespace; execd accepts on it (--listen-fd).
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            listener.listen(128)
            fds["listen"] = listener.fileno()
        launch = _launch(spec, plan, fds)
        log_fd = os.open(
            plan.directory / "private" / "execd.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        popen = subprocess.Popen(
            launch.argv,
            env=launch.env,
            cwd=launch.cwd,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            pass_fds=tuple(fds.values()),
            start_new_session=True,
        )
    except BaseException:
        os.close(ready_r)
        if exit_r >= 0:
            os.close(exit_r)
        raise
    finally:
        for fd in (token_r, token_w, ready_w, log_fd, exit_w):
            if fd >= 0:
                os.close(fd)
        if listener is not None:
            listener.close()
    os.set_blocking(ready_r, False)
    return Live(
        popen=popen,
        ready_fd=ready_r,
        timeline={"api_created": now, "started": now},
        usernet_exit=exit_r if exit_r >= 0 else None,
    )
