"""Run-condition readings for ``GET /probe`` (paper §4.5).

Each field is ``{"value": ..., "source": "<where it was read>"}`` or
``{"unreadable": "<why>"}``. Invariant: a field is never guessed - if the
file, syscall or connection that would show it is missing, the field says
unreadable and why. cgroup v2 (``cpu.max``, ``memory.max``) and v1
(``cpu.cfs_quota_us``/``cpu.cfs_period_us``, ``memory.limit_in_bytes``) are
both read, for the process's own cgroup from /proc/self/cgroup, and the
source names which one applied.
"""

import errno
import os
import pwd
import socket
from typing import Any, Dict, List, Optional, Tuple

Reading = Dict[str, Any]
UNLIMITED_V1 = 1 << 62  # v1 reports "no limit" as a page-rounded LONG_MAX


def value(v: Any, source: str) -> Reading:
    return {"value": v, "source": source}


def unreadable(why: str) -> Reading:
    return {"unreadable": why}


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _own_cgroups(proc_self: str) -> List[Tuple[str, str]]:
    """(controllers, path) pairs of this process; controllers is "" for v2."""
    text = _read(os.path.join(proc_self, "cgroup"))
    out = []
    for line in (text or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[1], parts[2]))
    return out


def _cgroup_file(
    root: str, proc_self: str, controller: str, name: str
) -> Optional[Tuple[str, str, str]]:
    """Find ``name`` for our cgroup: (version, path, content) or None."""
    candidates = []  # type: List[Tuple[str, str]]
    for controllers, rel in _own_cgroups(proc_self):
        rel = rel.lstrip("/")
        if controllers == "" and controller == "":
            for base in (root, os.path.join(root, "unified")):
                candidates += [
                    ("v2", os.path.join(base, rel, name)),
                    ("v2", os.path.join(base, name)),
                ]
        elif controller and controller in controllers.split(","):
            for mount in (controllers, controller):
                base = os.path.join(root, mount)
                candidates += [
                    ("v1", os.path.join(base, rel, name)),
                    ("v1", os.path.join(base, name)),
                ]
    for version, path in candidates:
        content = _read(path)
        if content is not None:
            return version, path, content
    return None


def cpu_quota(root: str, proc_self: str) -> Reading:
    v2 = _cgroup_file(root, proc_self, "", "cpu.max")
    if v2 is not None:
        quota, _, period = v2[2].partition(" ")
        if quota == "max":
            return value("unlimited", "cgroup v2 %s = %r" % (v2[1], v2[2]))
        try:
            return value(round(int(quota) / int(period), 4), "cgroup v2 %s = %r" % (v2[1], v2[2]))
        except ValueError:
            return unreadable("cannot parse %s: %r" % (v2[1], v2[2]))
    q = _cgroup_file(root, proc_self, "cpu", "cpu.cfs_quota_us")
    p = _cgroup_file(root, proc_self, "cpu", "cpu.cfs_period_us")
    if q is None or p is None:
        return unreadable(
            "no cpu.max (v2) or cpu.cfs_quota_us/cpu.cfs_period_us (v1) for this "
            "process's cgroup under %s" % root
        )
    src = "cgroup v1 %s = %s, %s = %s" % (q[1], q[2], p[1], p[2])
    try:
        quota_us, period_us = int(q[2]), int(p[2])
    except ValueError:
        return unreadable("cannot parse " + src)
    return value("unlimited" if quota_us < 0 else round(quota_us / period_us, 4), src)


def memory_limit(root: str, proc_self: str) -> Reading:
    v2 = _cgroup_file(root, proc_self, "", "memory.max")
    if v2 is not None:
        if v2[2] == "max":
            return value("unlimited", "cgroup v2 %s = max" % v2[1])
        try:
            return value(int(v2[2]), "cgroup v2 %s (bytes)" % v2[1])
        except ValueError:
            return unreadable("cannot parse %s: %r" % (v2[1], v2[2]))
    v1 = _cgroup_file(root, proc_self, "memory", "memory.limit_in_bytes")
    if v1 is None:
        return unreadable(
            "no memory.max (v2) or memory.limit_in_bytes (v1) for this process's "
            "cgroup under %s" % root
        )
    try:
        limit = int(v1[2])
    except ValueError:
        return unreadable("cannot parse %s: %r" % (v1[1], v1[2]))
    if limit >= UNLIMITED_V1:
        return value("unlimited", "cgroup v1 %s = %d (no limit)" % (v1[1], limit))
    return value(limit, "cgroup v1 %s (bytes)" % v1[1])


def visible_cpus() -> Reading:
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError) as e:
        return unreadable("sched_getaffinity failed: %s" % e)
    return value(len(cpus), "sched_getaffinity(0) = %s" % cpus)


def egress(target: str, timeout: float) -> Reading:
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        return unreadable("egress target %r is not HOST:PORT" % target)
    src = "TCP connect to %s within %gs" % (target, timeout)
    try:
        conn = socket.create_connection((host, int(port)), timeout=timeout)
    except socket.gaierror as e:
        return unreadable("%s: name resolution failed (%s)" % (src, e))
    except socket.timeout:
        return value("denied", src + ": no answer (timed out)")
    except OSError as e:
        return value("denied", "%s: %s" % (src, errno.errorcode.get(e.errno or 0, str(e))))
    conn.close()
    return value("open", src + ": connected")


def user() -> Dict[str, Reading]:
    uid, gid = os.getuid(), os.getgid()
    try:
        name = value(pwd.getpwuid(uid).pw_name, "getpwuid(%d)" % uid)
    except KeyError:
        name = unreadable("uid %d has no passwd entry" % uid)
    return {"uid": value(uid, "getuid()"), "gid": value(gid, "getgid()"), "user": name}


def time_zone(shell_env: Optional[Dict[str, str]], etc: str) -> Reading:
    if shell_env is not None and shell_env.get("TZ"):
        return value(shell_env["TZ"], "TZ in the persistent shell's environment")
    localtime = os.path.join(etc, "localtime")
    try:
        target = os.readlink(localtime)
    except FileNotFoundError:
        if shell_env is None:
            return unreadable("the shell environment is unreadable and %s is missing" % localtime)
        return value("UTC", "TZ unset in the shell and no %s: glibc uses UTC" % localtime)
    except OSError:
        return unreadable("%s is not a symlink to a named zone" % localtime)
    zone = target.split("zoneinfo/", 1)[1] if "zoneinfo/" in target else None
    if zone is None:
        return unreadable("%s points to %s, not into a zoneinfo tree" % (localtime, target))
    return value(zone, "%s -> %s (TZ unset in the shell)" % (localtime, target))


def hash_seed(shell_env: Optional[Dict[str, str]]) -> Reading:
    if shell_env is None:
        return unreadable("the persistent shell's environment could not be read")
    seed = shell_env.get("PYTHONHASHSEED")
    if seed is None:
        return value(None, "PYTHONHASHSEED unset in the shell: random per Python process")
    return value(seed, "PYTHONHASHSEED in the persistent shell's environment")


def probe(
    egress_target: str,
    egress_timeout: float,
    cgroup_root: str,
    default_timeout: float,
    shell_env: Optional[Dict[str, str]],
    proc_self: str = "/proc/self",
    etc: str = "/etc",
) -> Dict[str, Reading]:
    readings = {
        "egress": egress(egress_target, egress_timeout),
        "cpu_quota": cpu_quota(cgroup_root, proc_self),
        "visible_cpus": visible_cpus(),
        "memory_limit": memory_limit(cgroup_root, proc_self),
        "time_zone": time_zone(shell_env, etc),
        "hash_seed": hash_seed(shell_env),
        "time_limit": value(
            default_timeout,
            "execd --default-timeout: the per-command limit when a request sends no timeout_s",
        ),
    }
    readings.update(user())
    return readings
