"""The state check's comparison and exact undo of single differences.

Pure functions over two snapshots (``statescan`` records) plus the file-level
undo; ``state.StateManager`` orchestrates them.

Invariant: an undo writes only bytes recorded at baseline (a stored copy or
the git blob the file equalled) and returns None - never guesses - when it has
no exact undo; ``why_not`` then says what was missing.
"""

import os
import shutil
import stat
from typing import Any, Dict, List, Optional, Tuple

from . import statescan as scan

Diff = Dict[str, Any]


def diff(base: Dict[str, Any], now: Dict[str, Any]) -> List[Diff]:
    """Every difference between two snapshots, files first, in a stable order."""
    out = []  # type: List[Diff]
    bf, nf = base["files"], now["files"]
    for path in sorted(set(bf) | set(nf)):
        b, n = bf.get(path), nf.get(path)
        if b is None:
            out.append(
                {
                    "kind": "file",
                    "change": "added",
                    "path": path,
                    "category": n["cat"],
                    "type": n["t"],
                }
            )
        elif n is None:
            out.append(
                {
                    "kind": "file",
                    "change": "removed",
                    "path": path,
                    "category": b["cat"],
                    "type": b["t"],
                }
            )
        else:
            what = file_change(b, n)
            if what:
                out.append(
                    {
                        "kind": "file",
                        "change": "modified",
                        "path": path,
                        "category": b["cat"],
                        "type": b["t"],
                        "detail": what,
                    }
                )
    for repo, b in base["git"].items():
        n = now["git"].get(repo, {})
        for ref in sorted(set(b["refs"]) | set(n.get("refs", {}))):
            old, new = b["refs"].get(ref), n.get("refs", {}).get(ref)
            if old != new:
                out.append(
                    {
                        "kind": "git_ref",
                        "change": "moved" if old and new else "added" if new else "removed",
                        "repo": repo,
                        "ref": ref,
                        "from": old,
                        "to": new,
                    }
                )
        if (b["head_symbolic"], b["head"]) != (n.get("head_symbolic"), n.get("head")):
            out.append(
                {
                    "kind": "git_head",
                    "change": "moved",
                    "repo": repo,
                    "from": b["head_symbolic"] or b["head"],
                    "to": n.get("head_symbolic") or n.get("head"),
                    "from_commit": b["head"],
                    "to_commit": n.get("head"),
                }
            )
        if b["index_digest"] != n.get("index_digest"):
            out.append({"kind": "git_index", "change": "modified", "repo": repo})
    be, ne = base["env"], now["env"]
    for name in sorted(set(be) | set(ne)):
        if be.get(name) != ne.get(name):
            out.append(
                {
                    "kind": "env",
                    "change": "added"
                    if name not in be
                    else "removed"
                    if name not in ne
                    else "modified",
                    "name": name,
                    "from": be.get(name),
                    "to": ne.get(name),
                }
            )
    if base["timezone"] != now["timezone"]:
        out.append(
            {
                "kind": "timezone",
                "change": "modified",
                "from": base["timezone"],
                "to": now["timezone"],
            }
        )
    for key in sorted(set(base["processes"]) ^ set(now["processes"])):
        p = now["processes"].get(key) or base["processes"][key]
        out.append(
            {
                "kind": "process",
                "change": "added" if key in now["processes"] else "removed",
                "pid": p["pid"],
                "cmdline": p["cmdline"],
                "key": key,
            }
        )
    for root in now["truncated"]:
        out.append({"kind": "scan", "change": "truncated", "path": root})
    return out


def file_change(b: scan.Entry, n: scan.Entry) -> str:
    if b["t"] != n["t"]:
        return "type %s -> %s" % (b["t"], n["t"])
    if b["t"] == "l":
        return "link %s -> %s" % (b["link"], n["link"]) if b["link"] != n["link"] else ""
    if b["t"] == "f":
        if b["sha256"] is None or n["sha256"] is None:
            if (b["size"], b["mtime_ns"]) != (n["size"], n["mtime_ns"]):
                return "size/mtime changed (not hashed: larger than the hash limit)"
        elif b["sha256"] != n["sha256"]:
            return "content sha256 %s -> %s" % (b["sha256"][:12], n["sha256"][:12])
        if b["mode"] != n["mode"]:
            return "mode %o -> %o" % (b["mode"], n["mode"])
    return ""


def undo_file(
    d: Diff, b: Optional[scan.Entry], git: scan.Git, store: scan.BlobStore
) -> Optional[str]:
    path = d["path"]
    if d["change"] == "added":
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        return "deleted"
    assert b is not None
    if os.path.isdir(path) and not os.path.islink(path) and b["t"] != "d":
        shutil.rmtree(path)
    if b["t"] == "d":
        if os.path.lexists(path) and not os.path.isdir(path):
            os.unlink(path)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, b["mode"])
        return "directory recreated"
    if b["t"] == "l":
        atomic_symlink(path, b["link"])
        return "symlink recreated"
    if b["t"] != "f":
        return None
    current = os.lstat(path) if os.path.lexists(path) else None
    if (
        current is not None
        and stat.S_ISREG(current.st_mode)
        and d.get("detail", "").startswith("mode")
    ):
        os.chmod(path, b["mode"])
        return "mode restored"
    data = scan.read_copy(git, store, path, b)
    if data is None:
        return None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    atomic_bytes(path, data, b["mode"])
    return "baseline bytes written back"


def why_not(d: Diff, base: Dict[str, Any]) -> str:
    if d["kind"] == "file":
        b = base["files"].get(d["path"])
        if b is not None and b["t"] == "f" and not b.get("copy"):
            return (
                "baseline bytes were not stored (%d bytes; over the copy limit or the copy "
                "budget)" % b["size"]
            )
        return "no exact undo for a %s change of type %s" % (d["change"], d.get("type"))
    if d["kind"] == "process":
        return "a baseline process is gone and cannot be brought back"
    if d["kind"] == "scan":
        return "the scan stopped early; part of this tree was not compared"
    return "no exact undo recorded for this change"


def restore_order(d: Diff) -> Tuple[int, int, str]:
    rank = {
        "process": 0,
        "git_ref": 1,
        "git_head": 2,
        "git_index": 3,
        "file": 4,
        "env": 5,
        "timezone": 6,
    }.get(d["kind"], 7)
    path = d.get("path", "")
    depth = path.count("/")
    if d["kind"] == "file" and d["change"] != "added":
        depth = depth if d.get("type") == "d" else depth + 1000  # directories before files
    return rank, depth, path


def atomic_bytes(path: str, data: bytes, mode: int) -> None:
    tmp = "%s.execd-restore-%d" % (path, os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
        os.fchmod(f.fileno(), mode)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_symlink(path: str, target: str) -> None:
    tmp = "%s.execd-restore-%d" % (path, os.getpid())
    os.symlink(target, tmp)
    os.replace(tmp, path)
