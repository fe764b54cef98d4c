"""Per-test results from pytest's ``-rA`` summary, and the verdict they give. Pure: no Django.

This is the SWE-bench harness's rule (its ``parse_log_pytest`` and ``get_eval_report``),
kept exact where the harness is exact and stricter where it is lenient:
* A result line is ``STATUS test_id`` or ``STATUS test_id - message`` in pytest's
  "short test summary info" section (the section ``-rA`` prints); STATUS is one of
  PASSED, FAILED, ERROR, SKIPPED, XFAIL, XPASS. When a log has that section, only lines
  after its header are read, so a test that prints ``PASSED x`` cannot forge a result.
  Unlike the harness's ``line.split()[1]``, a test id with spaces (a parametrize id) is kept
  whole. ``SKIPPED [n] file:line: reason`` lines name no test and are not results.
* A test PASSES when its status is PASSED or XFAIL (the harness's ``test_passed``; here
  ``passed``). A test that is missing, failed, errored, skipped or XPASSed did not pass.
* Resolved only when EVERY FAIL_TO_PASS and EVERY PASS_TO_PASS test passes. (The harness
  leaves a test that is neither passed nor failed — e.g. skipped — out of its rates; we
  count it as not passed: a fix that skips the test it was meant to fix is not a fix.)
* When a test appears in several suites or several times, the LAST line wins (the
  harness's dict assignment), except that a failure anywhere is never overwritten by a
  pass: a test id that both passed and failed did not pass.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field


class Status(enum.StrEnum):
    """A test's status as pytest's summary line names it (SWE-bench's ``TestStatus``)."""

    PASSED = "PASSED"
    FAILED = "FAILED"
    ERROR = "ERROR"
    SKIPPED = "SKIPPED"
    XFAIL = "XFAIL"
    XPASS = "XPASS"


PASSING = frozenset({Status.PASSED, Status.XFAIL})
FAILING = frozenset({Status.FAILED, Status.ERROR, Status.XPASS})


class Verdict(enum.StrEnum):
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"
    NO_VERDICT = "no_verdict"


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_SUMMARY_HEADER = re.compile(r"^=+ short test summary info =+$")
_RESULT = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.+)$")


def parse_pytest_summary(log: str) -> dict[str, Status]:
    """Map each test id named in the ``-rA`` summary lines of one pytest run to its status."""
    lines = [_ANSI.sub("", line).rstrip("\r") for line in log.splitlines()]
    for index, line in enumerate(lines):
        if _SUMMARY_HEADER.match(line.strip()):
            lines = lines[index + 1 :]
            break
    statuses: dict[str, Status] = {}
    for line in lines:
        match = _RESULT.match(line)
        if match is None:
            continue
        status, rest = Status(match.group(1)), match.group(2)
        if rest.startswith("["):  # "SKIPPED [1] file:line: reason" names no test id
            continue
        test_id = _test_id(rest, status)
        if not test_id:
            continue
        _record(statuses, test_id, status)
    return statuses


def _test_id(rest: str, status: Status) -> str:
    """The test id of a summary line: PASSED lines carry none but the id; others may add
    `` - message``. A parametrize id (``name[...]``) may itself hold `` - ``: it ends at the
    bracket that closes its first ``[``."""
    if status is Status.PASSED:
        return rest.strip()
    head = rest.split(" - ", 1)[0]
    if "[" not in head:
        return head.strip()
    depth = 0
    for index in range(rest.index("["), len(rest)):
        if rest[index] == "[":
            depth += 1
        elif rest[index] == "]":
            depth -= 1
            if depth == 0:
                return rest[: index + 1].strip()
    return head.strip()


def merge_results(runs: Iterable[Mapping[str, Status]]) -> dict[str, Status]:
    """Combine the statuses of several suites (same rule as repeated lines in one log)."""
    merged: dict[str, Status] = {}
    for run in runs:
        for test_id, status in run.items():
            _record(merged, test_id, status)
    return merged


def _record(statuses: dict[str, Status], test_id: str, status: Status) -> None:
    if statuses.get(test_id) in FAILING and status not in FAILING:
        return
    statuses[test_id] = status


@dataclass(frozen=True)
class Decision:
    """The verdict from per-test results, with what kept it from resolving."""

    verdict: Verdict
    reason: str
    fail_to_pass_not_passed: tuple[str, ...] = field(default=())
    pass_to_pass_not_passed: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, object]:
        return {
            "verdict": self.verdict.value,
            "reason": self.reason,
            "fail_to_pass_not_passed": list(self.fail_to_pass_not_passed),
            "pass_to_pass_not_passed": list(self.pass_to_pass_not_passed),
        }


def passed(test_id: str, statuses: Mapping[str, Status]) -> bool:
    return statuses.get(test_id) in PASSING


def decide(
    *,
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    statuses: Mapping[str, Status],
) -> Decision:
    """Resolved only when every FAIL_TO_PASS and PASS_TO_PASS test passed; else a valid 0."""
    f2p = tuple(test for test in fail_to_pass if not passed(test, statuses))
    p2p = tuple(test for test in pass_to_pass if not passed(test, statuses))
    if not f2p and not p2p:
        return Decision(Verdict.RESOLVED, "resolved")
    parts = []
    if f2p:
        parts.append(f"{len(f2p)} of {len(fail_to_pass)} FAIL_TO_PASS not passed")
    if p2p:
        parts.append(f"{len(p2p)} of {len(pass_to_pass)} PASS_TO_PASS not passed")
    return Decision(Verdict.UNRESOLVED, "tests_failed: " + "; ".join(parts), f2p, p2p)


def patch_did_not_apply(detail: str) -> Decision:
    """A patch that no step of the apply chain takes is a valid 0 (never ``no_verdict``)."""
    return Decision(Verdict.UNRESOLVED, f"patch_did_not_apply: {detail}"[:500])
