"""Snapshots for the state check: file trees, git repositories, pristine copies.

A snapshot maps each watched path to a small record::

    {"t": "f"|"l"|"d"|"o", "mode": int, "size": int, "sha256": str|None,
     "mtime_ns": int, "link": str|None, "cat": "<category>", "copy": str|None}

``copy`` says where the baseline bytes can be had back: ``"blob"`` (a copy in
the state directory's content-addressed store) or ``"git:<sha1>"`` (the
tracked file equalled its index blob, so git holds the bytes).

Invariants: walks never follow symlinks and never enter excluded trees (the
state directory, execd's run directory); installed-package directories are
read two levels deep only (paper Appendix I); git runs with hooks and
fsmonitor off and optional locks disabled, so a scan never changes the repo.
"""

import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

from .reaper import Reaper

Entry = Dict[str, Any]
CHUNK = 1 << 20
MAX_HASH_BYTES = 256 << 20
MAX_ENTRIES_PER_ROOT = 200000


class BlobStore:
    """Content-addressed pristine copies, bounded by a total budget."""

    def __init__(self, root: str, budget: int) -> None:
        self.root = root
        self.budget = budget
        self.used = 0
        os.makedirs(root, mode=0o700, exist_ok=True)

    def path(self, sha256: str) -> str:
        return os.path.join(self.root, sha256)

    def reserve(self, size: int) -> bool:
        if self.used + size > self.budget:
            return False
        self.used += size
        return True


class Git:
    def __init__(self, reaper: Reaper, git: str = "git") -> None:
        self.reaper = reaper
        self.git = git

    def __call__(
        self, repo: str, *args: str, check: bool = True, data: Optional[bytes] = None
    ) -> bytes:
        argv = [
            self.git,
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.fsmonitor=false",
            "-c",
            "safe.directory=*",
            "-C",
            repo,
        ] + list(args)
        env = dict(os.environ, GIT_OPTIONAL_LOCKS="0", GIT_TERMINAL_PROMPT="0")
        proc = self.reaper.spawn(
            lambda: subprocess.Popen(
                argv,
                stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
            )
        )  # type: subprocess.Popen
        try:
            out, err = proc.communicate(data, timeout=120)
        finally:
            if proc.returncode is None:
                proc.kill()
                proc.wait()
            self.reaper.forget(proc.pid)
        if check and proc.returncode != 0:
            raise RuntimeError(
                "git %s failed in %s: %s"
                % (" ".join(args), repo, err.decode("utf-8", "replace").strip())
            )
        return out


def is_repo(path: str) -> bool:
    return os.path.isdir(os.path.join(path, ".git"))


def walk(
    top: str, exclude: Set[str], max_depth: Optional[int] = None, skip_names: Tuple[str, ...] = ()
) -> Iterator[Tuple[str, os.stat_result]]:
    """Yield (path, lstat) below ``top`` (not ``top`` itself), depth-first."""
    stack = [(top, 1)]
    count = 0
    while stack:
        directory, depth = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError:
            continue
        for entry in entries:
            if entry.path in exclude or entry.name in skip_names:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            count += 1
            if count > MAX_ENTRIES_PER_ROOT:
                raise OverflowError(top)
            yield entry.path, st
            if stat.S_ISDIR(st.st_mode) and (max_depth is None or depth < max_depth):
                stack.append((entry.path, depth + 1))


def fingerprint(
    path: str,
    st: os.stat_result,
    cat: str,
    store: Optional[BlobStore],
    max_copy: int,
    git_sha1: Optional[str] = None,
) -> Entry:
    """Record one path; copy its bytes into ``store`` when it is small enough."""
    e = {
        "mode": stat.S_IMODE(st.st_mode),
        "size": st.st_size,
        "sha256": None,
        "mtime_ns": st.st_mtime_ns,
        "link": None,
        "cat": cat,
        "copy": None,
    }  # type: Entry
    if stat.S_ISLNK(st.st_mode):
        e["t"] = "l"
        try:
            e["link"] = os.readlink(path)
        except OSError:
            pass
        return e
    if stat.S_ISDIR(st.st_mode):
        e["t"], e["size"] = "d", 0
        return e
    if not stat.S_ISREG(st.st_mode):
        e["t"] = "o"
        return e
    e["t"] = "f"
    if st.st_size > MAX_HASH_BYTES:
        return e  # compared by size and mtime only
    sha = hashlib.sha256()
    sha1 = hashlib.sha1(b"blob %d\0" % st.st_size) if git_sha1 else None
    copy_to = None
    tmp = None  # type: Optional[str]
    if store is not None and not git_sha1 and st.st_size <= max_copy and store.reserve(st.st_size):
        fd, tmp = tempfile.mkstemp(dir=store.root)
        copy_to = os.fdopen(fd, "wb")
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(CHUNK), b""):
                sha.update(block)
                if sha1 is not None:
                    sha1.update(block)
                if copy_to is not None:
                    copy_to.write(block)
    except OSError:
        e["sha256"] = None
    else:
        e["sha256"] = sha.hexdigest()
    if copy_to is not None and tmp is not None:
        copy_to.close()
        if e["sha256"] is not None:
            os.replace(tmp, store.path(e["sha256"]))  # type: ignore[union-attr]
            e["copy"] = "blob"
        else:
            os.unlink(tmp)
    if sha1 is not None and sha1.hexdigest() == git_sha1:
        e["copy"] = "git:" + git_sha1
    elif (
        git_sha1
        and e["sha256"]
        and store is not None
        and st.st_size <= max_copy
        and store.reserve(st.st_size)
    ):
        shutil.copyfile(path, store.path(e["sha256"]))  # a tracked file that differs from git
        e["copy"] = "blob"
    return e


def scan_tree(
    top: str,
    cat: str,
    exclude: Set[str],
    store: Optional[BlobStore],
    max_copy: int,
    max_depth: Optional[int] = None,
) -> Tuple[Dict[str, Entry], bool]:
    files = {}  # type: Dict[str, Entry]
    try:
        for path, st in walk(top, exclude, max_depth):
            files[path] = fingerprint(path, st, cat, store, max_copy)
    except OverflowError:
        return files, True
    return files, False


def _z(out: bytes) -> List[str]:
    return [p.decode("utf-8", "surrogateescape") for p in out.split(b"\0") if p]


def scan_repo(
    git: Git, repo: str, exclude: Set[str], store: Optional[BlobStore], max_copy: int
) -> Tuple[Dict[str, Entry], Dict[str, Any], bool]:
    """Worktree files by category, the repo's config/hooks/info, and its git state."""
    index_blobs = {}  # type: Dict[str, str]
    for line in _z(git(repo, "ls-files", "-s", "-z")):
        meta, _, name = line.partition("\t")
        index_blobs[os.path.join(repo, name)] = meta.split()[1]
    ignored = {
        os.path.join(repo, p)
        for p in _z(git(repo, "ls-files", "-z", "-o", "-i", "--exclude-standard", "--directory"))
    }
    files = {}  # type: Dict[str, Entry]
    truncated = False
    try:
        for path, st in walk(repo, exclude, skip_names=(".git",)):
            blob = index_blobs.get(path)
            if blob is not None:
                cat = "tracked"
            elif path in ignored or path + "/" in ignored or _under(path, ignored):
                cat = "ignored"
            else:
                cat = "untracked"
            files[path] = fingerprint(path, st, cat, store, max_copy, git_sha1=blob)
            if blob is not None:
                files[path]["repo"] = repo
    except OverflowError:
        truncated = True
    dot_git = os.path.join(repo, ".git")
    for name, cat in (("config", "git_config"), ("hooks", "git_hook"), ("info", "git_info")):
        path = os.path.join(dot_git, name)
        if os.path.isdir(path):
            sub, _trunc = scan_tree(path, cat, exclude, store, max_copy)
            files.update(sub)
        elif os.path.lexists(path):
            files[path] = fingerprint(path, os.lstat(path), cat, store, max_copy)
    head = git(repo, "rev-parse", "--verify", "-q", "HEAD", check=False).strip().decode() or None
    sym = git(repo, "symbolic-ref", "-q", "HEAD", check=False).strip().decode() or None
    refs = {}
    for line in (
        git(repo, "for-each-ref", "--format=%(refname) %(objectname)").decode().splitlines()
    ):
        name, _, sha = line.partition(" ")
        refs[name] = sha
    index_path = os.path.join(dot_git, "index")
    index_digest = hashlib.sha256(git(repo, "ls-files", "-s", "-z")).hexdigest()
    index_copy = None
    if store is not None and os.path.isfile(index_path):
        size = os.path.getsize(index_path)
        if store.reserve(size):
            with open(index_path, "rb") as f:
                data = f.read()
            index_copy = hashlib.sha256(data).hexdigest()
            with open(store.path(index_copy), "wb") as f:
                f.write(data)
    state = {
        "head": head,
        "head_symbolic": sym,
        "refs": refs,
        "index_digest": index_digest,
        "index_copy": index_copy,
    }
    return files, state, truncated


def _under(path: str, dirs: Set[str]) -> bool:
    """True when a parent of ``path`` is listed (git lists ignored dirs as "dir/")."""
    parent = os.path.dirname(path)
    while len(parent) > 1:
        if parent + "/" in dirs:
            return True
        parent = os.path.dirname(parent)
    return False


def read_copy(git: Git, store: BlobStore, path: str, e: Entry) -> Optional[bytes]:
    """The baseline bytes of a file entry, or None if they were not kept."""
    copy = e.get("copy")
    if copy == "blob" and e.get("sha256"):
        try:
            with open(store.path(e["sha256"]), "rb") as f:
                return f.read()
        except OSError:
            return None
    if copy and copy.startswith("git:") and e.get("repo"):
        try:
            return git(e["repo"], "cat-file", "blob", copy[4:])
        except RuntimeError:
            return None
    return None
