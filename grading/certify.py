"""What a certification certifies, and the preflight rule (§4.3, Appendix H). Pure: no ORM.

Rules a reader must not break:
* ``job_grading_config`` is THE list of job fields a grading's outcome may depend on; a
  certification matches a job exactly when their configurations hash the same. A field
  added to the job that changes how gradings run belongs here (checked reuse's options do).
* ``task_digest`` covers every task field a grading reads; ``chain`` folds the admitted
  tasks' digests in ``instance_id`` order: ``h0 = sha256("sandman-certification\\n" +
  config_hash)``, ``h_i = sha256(h_{i-1} + digest_i)`` (hex strings), so the chain pins both
  the configuration and every admitted task.
* Preflight, per task, with early stopping: the reference patch graded twice must resolve
  both times, then the empty patch graded twice must be unresolved both times; the first
  grading that disagrees rejects the task and nothing more is graded for it. A
  ``no_verdict`` rejects too (a task preflight cannot grade is not certified).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

RUNS_PER_KIND = 2
REFERENCE, EMPTY = "reference", "empty"


def canonical_hash(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def job_grading_config(
    *, egress: str, reuse_enabled: bool, reuse_max_uses: int, backend: str
) -> dict[str, Any]:
    """The job's configuration as far as grading outcomes go."""
    return {
        "backend": backend,
        "egress": egress,
        "reuse_enabled": bool(reuse_enabled),
        "reuse_max_uses": int(reuse_max_uses) if reuse_enabled else None,
    }


def config_differences(certified: Mapping[str, Any], job: Mapping[str, Any]) -> list[str]:
    """Each field that differs, as ``name: certified X, job Y``."""
    return [
        f"{key}: certified {certified.get(key)!r}, job {job.get(key)!r}"
        for key in sorted(set(certified) | set(job))
        if certified.get(key) != job.get(key)
    ]


def task_digest(fields: Mapping[str, Any]) -> str:
    """SHA-256 over the task fields a grading reads (canonical JSON of ``fields``)."""
    return canonical_hash({key: fields[key] for key in sorted(fields)})


def chain(config_hash: str, digests: Sequence[str]) -> str:
    head = hashlib.sha256(f"sandman-certification\n{config_hash}".encode()).hexdigest()
    for digest in digests:
        head = hashlib.sha256((head + digest).encode()).hexdigest()
    return head


@dataclass(frozen=True)
class Step:
    """What preflight does next for one task: grade ``kind`` again, or decide."""

    grade: str | None = None  # REFERENCE | EMPTY: queue one more grading of this kind
    admitted: bool | None = None  # decided: True / False; None while gradings are due
    reason: str = ""


def next_step(verdicts: Sequence[Mapping[str, str]]) -> Step:
    """The next step after ``verdicts`` ({kind, verdict, reason}, in the order graded)."""
    refs = [v for v in verdicts if v["kind"] == REFERENCE]
    empties = [v for v in verdicts if v["kind"] == EMPTY]
    for ref in refs:
        if ref["verdict"] != "resolved":
            return Step(admitted=False, reason=f"reference patch {ref['verdict']}: {ref['reason']}")
    if len(refs) < RUNS_PER_KIND:
        return Step(grade=REFERENCE)
    for empty in empties:
        if empty["verdict"] == "resolved":
            return Step(
                admitted=False,
                reason="empty patch resolved: the tests do not check the fix",
            )
        if empty["verdict"] != "unresolved":
            return Step(admitted=False, reason=f"empty patch {empty['verdict']}: {empty['reason']}")
    if len(empties) < RUNS_PER_KIND:
        return Step(grade=EMPTY)
    return Step(admitted=True, reason="reference resolved twice, empty patch unresolved twice")
