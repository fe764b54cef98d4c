"""What this host lets the local backend do, found once per provider.

``detect`` answers three questions: can sandboxes be isolated with bubblewrap (and if
not, why not), which interpreter runs execd, and which cgroup driver (if any) sets
limits. ``auto`` falls back to plain processes with a logged reason; ``require`` keeps
the reason so ``create`` can refuse with it; ``off`` never tries.

Invariant: nothing here is assumed from configuration alone. bubblewrap is probed by
running it, the cgroup driver by creating and removing a probe cgroup, and every host
path a sandbox binds is checked for reachability by the sandbox user.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sandboxes.providers.local import cgroups, isolation, usernet

log = logging.getLogger(__name__)

INIT_SCRIPT = Path(__file__).resolve().with_name("sandbox_init.py")
MODES = ("auto", "off", "require")


@dataclass(frozen=True)
class Runtime:
    isolated: bool
    python: isolation.Python
    cgroups: cgroups.CgroupDriver | None
    reason: str = ""  # why isolation is off, when it is
    usernet: str | None = None  # slirp4netns, when isolated: egress-allowed sandboxes need it


def _isolation_blocker(
    *, bwrap: str | None, uid: int, gid: int, execd_python: str, execd_dir: Path, root: Path
) -> tuple[str, isolation.Python | None]:
    reason = isolation.probe_bwrap(bwrap, uid, gid)
    if reason:
        return reason, None
    try:
        python = isolation.resolve_python(execd_python, isolated=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the execd python is unusable inside a sandbox: {exc}", None
    blocked = isolation.unreachable(
        [execd_dir / "execd", INIT_SCRIPT, *map(Path, python.binds)], traverse_only=(root,)
    )
    return blocked or "", python


def detect(
    *,
    mode: str,
    bwrap: str | None,
    uid: int,
    gid: int,
    execd_python: str,
    execd_dir: Path,
    root: Path,
    use_cgroups: bool,
) -> Runtime:
    root.mkdir(mode=0o711, parents=True, exist_ok=True)
    reason, python = "SANDMAN_LOCAL_ISOLATION=off", None
    if mode != "off":
        reason, python = _isolation_blocker(
            bwrap=bwrap,
            uid=uid,
            gid=gid,
            execd_python=execd_python,
            execd_dir=execd_dir,
            root=root,
        )
        if reason and mode == "auto":
            log.warning("local sandboxes run WITHOUT isolation: %s", reason)
    if reason or python is None:
        python = isolation.resolve_python(execd_python, isolated=False)
    driver = cgroups.detect() if use_cgroups else None
    _precompile(python, execd_dir)
    slirp = usernet.find() if not reason else None
    if not reason and slirp is None:
        log.warning("slirp4netns is missing: egress-allowed sandboxes will be refused")
    return Runtime(isolated=not reason, python=python, cgroups=driver, reason=reason, usernet=slirp)


def _precompile(python: isolation.Python, execd_dir: Path) -> None:
    """Write execd's bytecode once: inside a sandbox its source is read-only, so without
    this every sandbox start would compile execd again."""
    try:
        subprocess.run(
            [python.path, "-m", "compileall", "-q", str(execd_dir / "execd")],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        log.info("could not precompile execd", exc_info=True)
