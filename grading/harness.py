"""Patch capture in a rollout sandbox and the SWE-bench grading harness in a grading sandbox.

Both drive a sandbox only through its execd (``sandboxes.execd_client.ExecdClient``); the
verdict rule itself is ``grading.verdicts`` (pure). Rules a reader must not break:
* Capture diffs the agent's work against the task's BASE COMMIT (not HEAD: an agent may
  commit) through a throw-away index, so the sandbox's own index is untouched, and leaves
  out the task's test-configuration files: the patch is the agent's change only.
* Grading runs in a fresh sandbox at the base commit, in this order: apply the patch with
  the SWE-bench chain (``git apply --verbose``, ``--3way``, ``--reject``, then ``patch
  --batch --forward --fuzz=5 -p1``; the tree is reset to the base commit between tries),
  put back the test-configuration files and the official test files from the base commit,
  apply ``test_patch``, run each suite with its own time limit.
* A patch no step takes is a valid 0 (``unresolved``), as are failing tests. Anything the
  harness cannot finish for a reason outside the patch (execd unreachable or erroring, a
  suite over its time limit, a shell that restarted) raises ``InfrastructureFailure``: the
  caller retries elsewhere and never scores it.
* Logs and patches travel as files read back with ``read_bytes`` (exact, uncapped), never
  through exec output, which execd caps at 100 KiB.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from grading.verdicts import Decision, Status, decide, merge_results, parse_pytest_summary
from grading.verdicts import patch_did_not_apply as did_not_apply
from sandboxes.execd_client import ExecdClient, ExecdError

# Inside .git: never part of a diff, never touched by the patch or the tests.
CAPTURE_FILE = ".git/sandman-capture.patch"
AGENT_PATCH_FILE = ".git/sandman-agent.patch"
TEST_PATCH_FILE = ".git/sandman-test.patch"
APPLY_CHAIN = (
    "git apply --verbose {patch}",
    "git apply --verbose --3way {patch}",
    "git apply --verbose --reject {patch}",
    "patch --batch --forward --fuzz=5 -p1 -i {patch}",
)
GIT_TIMEOUT_S = 120.0
_DIFF_PATHS = re.compile(r"^diff --git a/(\S+) b/(\S+)$", re.MULTILINE)


class InfrastructureFailure(Exception):
    """The harness could not finish for a reason outside the patch: retry, never score."""


@dataclass(frozen=True)
class CapturedPatch:
    text: str
    sha256: str


@dataclass(frozen=True)
class SuiteRun:
    name: str
    exit_code: int
    duration_ms: float
    statuses: dict[str, Status]


@dataclass(frozen=True)
class HarnessResult:
    decision: Decision
    apply_step: str | None  # the chain step that took the patch; None when none did
    suites: tuple[SuiteRun, ...] = field(default=())

    def tests(self) -> dict[str, str]:
        merged = merge_results(suite.statuses for suite in self.suites)
        return {test: status.value for test, status in sorted(merged.items())}


def exclusion_pathspecs(patterns: Sequence[str]) -> list[str]:
    """Git pathspecs leaving out each pattern (a bare name matches in any directory)."""
    specs = []
    for pattern in patterns:
        glob = pattern if "/" in pattern else f"**/{pattern}"
        specs.append(f":(exclude,glob){glob}")
    return specs


def patch_paths(patch: str) -> list[str]:
    """Every path a unified diff names (old and new side), in order, without repeats."""
    seen: dict[str, None] = {}
    for old, new in _DIFF_PATHS.findall(patch):
        seen.setdefault(old, None)
        seen.setdefault(new, None)
    return list(seen)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


async def _run(
    execd: ExecdClient, command: str, *, timeout_s: float = GIT_TIMEOUT_S, timeout_ok: bool = False
) -> Any:
    """One command; with ``timeout_ok`` a timed-out command is returned (the caller checks)."""
    try:
        answer = await execd.exec(command, timeout_s=timeout_s)
    except ExecdError as exc:
        raise InfrastructureFailure(f"execd failed: {exc}") from exc
    if answer.shell_restarted or (answer.error and not timeout_ok):
        raise InfrastructureFailure(f"execd lost its shell: {answer.error or 'restarted'}")
    return answer


async def _read(execd: ExecdClient, path: str) -> str:
    try:
        return (await execd.read_bytes(path)).data().decode("utf-8", errors="replace")
    except ExecdError as exc:
        raise InfrastructureFailure(f"execd could not read {path}: {exc}") from exc


async def _write(execd: ExecdClient, path: str, text: str) -> None:
    try:
        await execd.write(path, text)
    except ExecdError as exc:
        raise InfrastructureFailure(f"execd could not write {path}: {exc}") from exc


async def capture_patch(
    execd: ExecdClient, *, base_commit: str, excluded: Sequence[str]
) -> CapturedPatch:
    """The agent's change in a rollout sandbox: work tree vs the base commit, exclusions out."""
    base = shlex.quote(base_commit)
    specs = " ".join(shlex.quote(spec) for spec in exclusion_pathspecs(excluded))
    script = (
        "set -e; __sm_idx=$(mktemp); trap 'rm -f \"$__sm_idx\"' EXIT; "
        f'export GIT_INDEX_FILE="$__sm_idx"; git read-tree {base}; git add -A; '
        f"git diff --cached --binary --no-color {base} --output={CAPTURE_FILE} -- . {specs}"
    )
    answer = await _run(execd, f"( {script} )")
    if answer.exit_code != 0:
        raise InfrastructureFailure(f"capture failed (exit {answer.exit_code}): {answer.output}")
    text = await _read(execd, CAPTURE_FILE)
    return CapturedPatch(text=text, sha256=sha256_text(text))


async def _reset_to(execd: ExecdClient, base: str) -> None:
    answer = await _run(execd, f"git reset -q --hard {base} && git clean -fdq")
    if answer.exit_code != 0:
        raise InfrastructureFailure(f"could not reset to the base commit: {answer.output}")


async def apply_patch(execd: ExecdClient, *, patch: str, base_commit: str) -> str | None:
    """Try the SWE-bench chain; the step that took the patch, or None (a valid 0)."""
    if not patch.strip():
        return "empty"
    base = shlex.quote(base_commit)
    await _write(execd, AGENT_PATCH_FILE, patch)
    for step in APPLY_CHAIN:
        command = step.format(patch=AGENT_PATCH_FILE)
        if (await _run(execd, command)).exit_code == 0:
            return step.split(" {patch}")[0].replace(" -i", "")
        await _reset_to(execd, base)
    return None


async def restore_from_base(execd: ExecdClient, *, base_commit: str, paths: Sequence[str]) -> None:
    """Each path back to its base-commit content; a path absent at the base is removed."""
    base = shlex.quote(base_commit)
    for path in paths:
        quoted = shlex.quote(path)
        command = (
            f"if git cat-file -e {base}:{quoted} 2>/dev/null; then "
            f"git checkout -q {base} -- {quoted}; else rm -rf -- {quoted}; fi"
        )
        answer = await _run(execd, command)
        if answer.exit_code != 0:
            raise InfrastructureFailure(f"could not restore {path}: {answer.output}")


async def _excluded_in_tree(execd: ExecdClient, *, base: str, excluded: Sequence[str]) -> list[str]:
    """Files matching the exclusions that differ from the base (changed, added or removed)."""
    specs = " ".join(
        shlex.quote(spec.replace(":(exclude,glob)", ":(glob)"))
        for spec in exclusion_pathspecs(excluded)
    )
    if not specs:
        return []
    answer = await _run(
        execd,
        f"{{ git diff --name-only {base} -- {specs}; "
        f"git ls-files --others --exclude-standard -- {specs}; }} | sort -u",
    )
    return [line for line in answer.output.splitlines() if line.strip()]


async def run_suite(
    execd: ExecdClient, *, name: str, command: str, time_limit_s: float
) -> SuiteRun:
    """One suite with its own time limit; over the limit is an infrastructure failure."""
    log = f".git/sandman-suite-{name}.log"
    rc_file = f".git/sandman-suite-{name}.rc"
    wrapped = f"rm -f {rc_file}; ( {command} ) > {log} 2>&1 < /dev/null; echo $? > {rc_file}"
    answer = await _run(execd, wrapped, timeout_s=time_limit_s, timeout_ok=True)
    rc_answer = await _run(execd, f"cat {rc_file} 2>/dev/null || echo none")
    rc_text = rc_answer.output.strip()
    if answer.error or not rc_text.isdigit():  # no exit status written: the suite was killed
        raise InfrastructureFailure(
            f"suite {name!r} did not finish within {time_limit_s:g} s: {answer.error or ''}"
        )
    statuses = parse_pytest_summary(await _read(execd, log))
    return SuiteRun(name, int(rc_text), answer.duration_ms, statuses)


async def grade_patch(
    execd: ExecdClient,
    *,
    base_commit: str,
    patch: str,
    test_patch: str,
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    suites: Sequence[dict[str, Any]],
    excluded: Sequence[str],
) -> HarnessResult:
    """Grade ``patch`` in a fresh grading sandbox whose workspace is at ``base_commit``."""
    base = shlex.quote(base_commit)
    step = await apply_patch(execd, patch=patch, base_commit=base_commit)
    if step is None:
        return HarnessResult(did_not_apply("no step of the SWE-bench apply chain took it"), None)
    test_files = patch_paths(test_patch)
    config_files = await _excluded_in_tree(execd, base=base, excluded=excluded)
    await restore_from_base(execd, base_commit=base_commit, paths=[*config_files, *test_files])
    if test_patch.strip():
        await _write(execd, TEST_PATCH_FILE, test_patch)
        applied = await _run(execd, f"git apply --verbose {TEST_PATCH_FILE}")
        if applied.exit_code != 0:
            # The official test files were just restored, so only the agent's patch (e.g. a
            # deleted directory) can stop them: a valid 0, like a patch that does not apply.
            return HarnessResult(did_not_apply("test_patch did not apply after it"), step)
    runs = []
    for suite in suites:
        runs.append(
            await run_suite(
                execd,
                name=str(suite["name"]),
                command=str(suite["command"]),
                time_limit_s=float(suite["time_limit_s"]),
            )
        )
    statuses = merge_results(run.statuses for run in runs)
    decision = decide(fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass, statuses=statuses)
    return HarnessResult(decision, step, tuple(runs))
