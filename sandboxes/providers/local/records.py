"""The on-disk record of a local sandbox: ``<root>/<name>/meta.json``.

This file is how a restarted controller finds, and destroys, sandboxes a previous
process started (``list_owned``, ``destroy`` by name). Layout of a sandbox directory::

    <root>/<name>/meta.json     this record (written first, removed last)
    <root>/<name>/workspace/    the sandbox's files (bound read-write at /workspace)
    <root>/<name>/private/      0700: token, execd log; never mounted in the sandbox

Invariants:
* The record is written (atomically: temp file + rename) right after the directory is
  made and before anything is started; it is removed only after the processes, the
  cgroup and the workspace are gone. A directory with a record is therefore always
  something ``destroy`` must clean.
* Names are checked before they become paths (:func:`check_name`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from sandman_site.errors import InvalidInput

META = "meta.json"
_NAME = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?$")


def check_name(name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
        raise InvalidInput(
            f"Sandbox name {name!r} must be 1-63 lowercase letters, digits, '-' or '.', "
            "starting and ending with a letter or digit."
        )
    return name


@dataclass
class SandboxRecord:
    name: str
    nonce: str
    uid: str
    job_id: int | None
    role: str
    image: str
    base_commit: str | None
    egress: str
    created: str  # ISO 8601, UTC
    isolated: bool
    pid: int | None = None
    pid_start: int | None = None
    address: str = ""
    cgroup: str = ""  # "" | "v1" | "v2"
    # The CPU limit still to be written to the cgroup (at Ready; see provider.py), or None.
    cpu_millis_pending: int | None = None
    guards: dict[str, object] = field(default_factory=dict)
    timeline: dict[str, str] = field(default_factory=dict)

    @property
    def created_at(self) -> dt.datetime | None:
        try:
            return dt.datetime.fromisoformat(self.created)
        except ValueError:
            return None


def sandbox_dir(root: Path, name: str) -> Path:
    return root / check_name(name)


def write(directory: Path, record: SandboxRecord) -> None:
    temp = directory / f".{META}.tmp"
    with open(temp, "w") as handle:
        json.dump(asdict(record), handle, sort_keys=True)
    os.replace(temp, directory / META)


def read(directory: Path) -> SandboxRecord | None:
    """The record, or None when there is none (or it is unreadable JSON)."""
    try:
        with open(directory / META) as handle:
            data = json.load(handle)
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    known = {f.name for f in fields(SandboxRecord)}
    try:
        return SandboxRecord(**{k: v for k, v in data.items() if k in known})
    except TypeError:
        return None


def stamp(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).isoformat()
