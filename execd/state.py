"""Checked reuse (paper Appendix I): baseline, check and restore a sandbox's state.

``baseline`` records, under a private state directory outside the workspace:
each git repository's HEAD, refs, index, config, hooks and its tracked
(content-fingerprinted), untracked and ignored files; installed-package
directories two levels deep (dist-info/egg-info metadata, ``*.pth``,
sitecustomize/usercustomize); the configured roots (by default /etc, home
directories, /tmp and the local bin directories); the persistent shell's
exported environment, the time zone and the sandbox's processes. Files under
the copy limit are kept as pristine copies (git-tracked files that equal
their index blob are restored from git instead).

``check`` lists every difference; ``restore`` undoes those with an exact undo
(delete what was added, write back baseline bytes, move refs back, restore
the index, kill stray processes, reset environment variables) and reports the
rest as unrestorable with the reason, then checks again.

Invariant: restore only ever writes bytes it recorded at baseline; it never
guesses content, and anything it cannot undo exactly is reported, not hidden.
"""

import hashlib
import json
import os
import shutil
import time
from typing import Any, Callable, Dict, List, Optional

from . import statescan as scan
from .procs import ProcessTracker, descendants, kill_processes
from .procs import scan as scan_procs
from .protocol import BaselineAnswer, CheckAnswer, RestoreAnswer, StateRequest
from .statediff import Diff, atomic_bytes, atomic_symlink, diff, restore_order, undo_file, why_not
from .wire import ApiError

IGNORED_ENV = ("_", "SANDMAN_EXECD")


class StateManager:
    def __init__(
        self,
        state_dir: str,
        workspace: str,
        roots: Optional[List[str]],
        site_packages: Optional[List[str]],
        max_copy: int,
        budget: int,
        exclude: List[str],
        env_reader: Callable[[], Dict[str, str]],
        env_writer: Callable[[Dict[str, str], List[str]], Any],
        site_reader: Callable[[], List[str]],
        tracker: ProcessTracker,
        shell_pid: Callable[[], Optional[int]],
        kill_grace: float,
    ) -> None:
        self.state_dir = state_dir
        self.workspace = workspace
        self.roots = roots
        self.site_packages = site_packages
        self.max_copy = max_copy
        self.budget = budget
        self.exclude = set(exclude) | {state_dir}
        self.env_reader = env_reader
        self.env_writer = env_writer
        self.site_reader = site_reader
        self.tracker = tracker
        self.shell_pid = shell_pid
        self.kill_grace = kill_grace
        self.git = scan.Git(tracker.reaper)

    # -- spec and snapshot -----------------------------------------------------

    def _spec(self, req: StateRequest) -> Dict[str, Any]:
        ws_repo = [self.workspace] if scan.is_repo(self.workspace) else []
        repos = [os.path.abspath(p) for p in (req.repos if req.repos is not None else ws_repo)]
        if req.roots is not None:
            roots = list(req.roots)
        else:
            if self.roots is not None:
                roots = list(self.roots)
            else:
                home = os.path.expanduser("~")
                roots = [
                    "/etc",
                    home,
                    "/home",
                    "/tmp",
                    "/usr/local/bin",
                    os.path.join(home, ".local", "bin"),
                ]
            if not ws_repo:  # a workspace without git is watched as plain files
                roots.append(self.workspace)
        site = (
            req.site_packages
            if req.site_packages is not None
            else (self.site_packages if self.site_packages is not None else self.site_reader())
        )
        roots = sorted({os.path.abspath(r) for r in roots if os.path.isdir(r)})
        roots = [r for r in roots if not any(r != o and r.startswith(o + "/") for o in roots)]
        return {
            "repos": repos,
            "roots": roots,
            "site_packages": sorted({os.path.abspath(p) for p in site if os.path.isdir(p)}),
            "max_copy_bytes": req.max_copy_bytes
            if req.max_copy_bytes is not None
            else self.max_copy,
            "copy_budget_bytes": req.copy_budget_bytes
            if req.copy_budget_bytes is not None
            else self.budget,
        }

    def _processes(self) -> Dict[str, Dict[str, Any]]:
        shell = self.shell_pid()
        helpers = self.tracker.reaper.known() | ({shell} if shell else set())
        out = {}
        for pid, info in self.tracker.sandbox_processes(exclude=helpers).items():
            out["%d:%d" % (pid, info.starttime)] = {"pid": pid, "cmdline": _cmdline(pid)}
        return out

    def _snapshot(self, spec: Dict[str, Any], store: Optional[scan.BlobStore]) -> Dict[str, Any]:
        max_copy = spec["max_copy_bytes"]
        skip = self.exclude | set(spec["repos"]) | set(spec["site_packages"])
        files = {}  # type: Dict[str, scan.Entry]
        truncated = []  # type: List[str]
        git = {}
        for repo in spec["repos"]:
            sub, git[repo], cut = scan.scan_repo(self.git, repo, self.exclude, store, max_copy)
            files.update(sub)
            truncated += [repo] if cut else []
        for site in spec["site_packages"]:
            sub, cut = scan.scan_tree(site, "packages", self.exclude, store, max_copy, max_depth=2)
            for path, e in sub.items():
                e["cat"] = _package_category(site, path)
            files.update(sub)
            truncated += [site] if cut else []
        for root in spec["roots"]:
            sub, cut = scan.scan_tree(root, root, skip, store, max_copy)
            files.update(sub)
            truncated += [root] if cut else []
        env = {k: v for k, v in self.env_reader().items() if k not in IGNORED_ENV}
        return {
            "spec": spec,
            "files": files,
            "git": git,
            "env": env,
            "timezone": _localtime(),
            "processes": self._processes(),
            "truncated": truncated,
        }

    # -- routes ------------------------------------------------------------------

    def baseline(self, req: StateRequest) -> BaselineAnswer:
        started = time.monotonic()
        spec = self._spec(req)
        shutil.rmtree(self.state_dir, ignore_errors=True)
        os.makedirs(self.state_dir, mode=0o700)
        store = scan.BlobStore(os.path.join(self.state_dir, "blobs"), spec["copy_budget_bytes"])
        snap = self._snapshot(spec, store)
        with open(os.path.join(self.state_dir, "baseline.json"), "w") as f:
            json.dump(snap, f)
        copies = sum(1 for e in snap["files"].values() if e.get("copy"))
        return BaselineAnswer(
            repos=spec["repos"],
            roots=spec["roots"],
            site_packages=spec["site_packages"],
            files=len(snap["files"]),
            restorable_files=copies,
            copied_bytes=store.used,
            processes=len(snap["processes"]),
            truncated=snap["truncated"],
            duration_ms=round((time.monotonic() - started) * 1000, 1),
        )

    def _load(self) -> Dict[str, Any]:
        try:
            with open(os.path.join(self.state_dir, "baseline.json")) as f:
                return json.load(f)
        except FileNotFoundError:
            raise ApiError(409, "no_baseline", "POST /state/baseline first") from None

    def check(self) -> CheckAnswer:
        started = time.monotonic()
        base = self._load()
        diffs = diff(base, self._snapshot(base["spec"], None))
        return CheckAnswer(
            clean=not diffs,
            differences=diffs,
            duration_ms=round((time.monotonic() - started) * 1000, 1),
        )

    def restore(self) -> RestoreAnswer:
        started = time.monotonic()
        base = self._load()
        diffs = diff(base, self._snapshot(base["spec"], None))
        store = scan.BlobStore(os.path.join(self.state_dir, "blobs"), 0)
        restored, failed = [], []  # type: List[Diff], List[Diff]
        ordered = sorted(diffs, key=restore_order)
        removed_dirs = []  # type: List[str]
        for d in ordered:
            if d["kind"] == "file" and any(d["path"].startswith(r + "/") for r in removed_dirs):
                restored.append(dict(d, action="removed with its added parent directory"))
                continue
            try:
                action = self._undo(d, base, store)
            except (OSError, RuntimeError) as e:
                failed.append(dict(d, reason="%s: %s" % (type(e).__name__, e)))
                continue
            if action is None:
                failed.append(dict(d, reason=why_not(d, base)))
            else:
                restored.append(dict(d, action=action))
                if d["kind"] == "file" and d["change"] == "added" and d.get("type") == "d":
                    removed_dirs.append(d["path"])
        after = diff(base, self._snapshot(base["spec"], None))
        return RestoreAnswer(
            restored=restored,
            unrestorable=failed,
            clean=not after,
            remaining=after,
            duration_ms=round((time.monotonic() - started) * 1000, 1),
        )

    # -- diff and undo -------------------------------------------------------------

    def _undo(self, d: Diff, base: Dict[str, Any], store: scan.BlobStore) -> Optional[str]:
        kind = d["kind"]
        if kind == "process" and d["change"] == "added":
            pid, start = (int(x) for x in d["key"].split(":"))
            kill_processes(
                lambda: self._alive_tree(pid, start),
                self.kill_grace,
                {os.getpgrp()},
                self.tracker.reaper,
                None,
            )
            return "killed"
        if kind == "git_ref":
            if d["to"] is None:
                self.git(d["repo"], "update-ref", d["ref"], d["from"])
            elif d["from"] is None:
                self.git(d["repo"], "update-ref", "-d", d["ref"], d["to"])
            else:
                self.git(d["repo"], "update-ref", d["ref"], d["from"], d["to"])
            return "ref set back to %s" % (d["from"] or "nothing")
        if kind == "git_head":
            b = base["git"][d["repo"]]
            if b["head_symbolic"]:
                self.git(d["repo"], "symbolic-ref", "HEAD", b["head_symbolic"])
                return "HEAD points to %s again" % b["head_symbolic"]
            if b["head"]:
                self.git(d["repo"], "update-ref", "--no-deref", "HEAD", b["head"])
                return "HEAD detached at %s again" % b["head"]
            return None
        if kind == "git_index":
            copy = base["git"][d["repo"]]["index_copy"]
            if not copy:
                return None
            with open(store.path(copy), "rb") as f:
                atomic_bytes(os.path.join(d["repo"], ".git", "index"), f.read(), 0o644)
            return "index restored from its baseline copy"
        if kind == "env":
            if d["from"] is None:
                self.env_writer({}, [d["name"]])
            else:
                self.env_writer({d["name"]: d["from"]}, [])
            return "environment variable reset"
        if kind == "file":
            return undo_file(d, base["files"].get(d["path"]), self.git, store)
        if kind == "timezone":
            want = base["timezone"]
            if want and want.startswith("link:"):
                atomic_symlink("/etc/localtime", want[5:])
                return "/etc/localtime relinked"
            return None
        return None

    def _alive_tree(self, pid: int, starttime: int) -> Dict[int, Any]:
        """The stray process and its descendants, if that pid still names it."""
        procs = scan_procs()
        root = procs.get(pid)
        if root is None or root.starttime != starttime:
            return {}  # gone (its orphans came back to execd and show up on their own)
        pids = descendants(procs, [pid]) | {pid}
        return {p: procs[p] for p in pids if procs[p].state not in "ZXx"}


def _localtime() -> Optional[str]:
    try:
        return "link:" + os.readlink("/etc/localtime")
    except FileNotFoundError:
        return None
    except OSError:
        try:
            with open("/etc/localtime", "rb") as f:
                return "file:" + hashlib.sha256(f.read()).hexdigest()
        except OSError:
            return None


def _cmdline(pid: int) -> str:
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _package_category(site: str, path: str) -> str:
    top = os.path.relpath(path, site).split(os.sep)[0]
    if top.endswith((".dist-info", ".egg-info")):
        return "package_metadata"
    if top.endswith(".pth"):
        return "pth"
    if top in ("sitecustomize.py", "usercustomize.py", "sitecustomize", "usercustomize"):
        return "sitecustomize"
    return "packages"
