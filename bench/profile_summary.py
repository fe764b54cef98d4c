#!/usr/bin/env python3
"""Summarise a py-spy ``--format raw`` profile (collapsed stacks) into busy-sample shares.

Each line of the input is ``frame;frame;...;frame COUNT`` (outermost first). The summary
puts every sample in one bucket by what its thread does (the first frame that names a
Sandman role: the database executor, the controller's loop, the pod/Events informers, the
Kubernetes client's executor, the trainer's loop), then lists the Sandman functions with the
most inclusive samples inside the database executor, and the top self frames overall.

Usage: ``python bench/profile_summary.py PROFILE.raw [--title TEXT] > bench/results/profile_X.txt``
"""

from __future__ import annotations

import argparse
import collections
import re
from pathlib import Path

BUCKETS = (
    ("database executor (ORM)", ("DbExecutor._work",)),
    (
        "informers (pod + Events watch)",
        ("Reflector._run", "PodInformer._run", "EventInformer._run"),
    ),
    ("kubernetes client executor", ("ThreadPoolExecutor", "_WorkItem.run")),
    (
        "event loops (controller + trainer)",
        ("BaseEventLoop.run_forever", "asyncio.run", "run_until_complete"),
    ),
)
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<where>[^()]*)\)$")


def bucket(frames: list[str]) -> str:
    for name, marks in BUCKETS:
        if any(any(m in f for m in marks) for f in frames):
            return name
    return "other (start-up, migrations, GC, ...)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("profile", type=Path)
    parser.add_argument("--title", default="")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    by_bucket: collections.Counter[str] = collections.Counter()
    inclusive_db: collections.Counter[str] = collections.Counter()
    inclusive_all: collections.Counter[str] = collections.Counter()
    self_frames: collections.Counter[str] = collections.Counter()
    total = 0
    for line in args.profile.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        which = bucket(frames)
        by_bucket[which] += count
        seen: set[str] = set()
        for f in frames:
            m = _FRAME.match(f)
            fn, where = (m.group("fn"), m.group("where")) if m else (f, "")
            path = where.rsplit(":", 1)[0]
            if path.startswith(("sandboxes/", "sandman_site/", "incidents/", "standin/")):
                key = f"{fn} ({path})"
                if key not in seen:
                    seen.add(key)
                    inclusive_all[key] += count
                    if which.startswith("database"):
                        inclusive_db[key] += count
        m = _FRAME.match(frames[-1])
        self_frames[(m.group("fn") + " (" + m.group("where") + ")") if m else frames[-1]] += count
    print(args.title or f"profile {args.profile.name}")
    print(f"busy samples: {total}")
    print("\n== where the busy samples are (by thread role) ==")
    for name, n in by_bucket.most_common():
        print(f"{100.0 * n / total:6.1f} %  {n:7d}  {name}")
    print("\n== Sandman functions, inclusive, inside the database executor ==")
    for name, n in inclusive_db.most_common(args.top):
        print(f"{100.0 * n / total:6.1f} %  {n:7d}  {name}")
    print("\n== Sandman functions, inclusive, all threads ==")
    for name, n in inclusive_all.most_common(args.top):
        print(f"{100.0 * n / total:6.1f} %  {n:7d}  {name}")
    print("\n== top self frames ==")
    for name, n in self_frames.most_common(args.top):
        print(f"{100.0 * n / total:6.1f} %  {n:7d}  {name}")


if __name__ == "__main__":
    main()
