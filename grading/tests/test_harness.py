"""Patch capture and the grading harness, for real: local sandboxes, execd over HTTP, git,
patch and pytest.

Each grading runs in its own fresh sandbox acquired through the controller with role
``grading``, as a trainer's would be; the rollout sandbox is a separate one (§4.3).
"""

from __future__ import annotations

import hashlib

import pytest

from grading.harness import InfrastructureFailure, capture_patch, grade_patch, patch_paths
from grading.tests import harness_support as hs
from grading.verdicts import Verdict

pytestmark = pytest.mark.django_db(transaction=True)


def _grade(sandboxes, **kwargs):
    box = sandboxes("grading")
    return hs.with_execd(box.address, box.token, lambda execd: grade_patch(execd, **kwargs))


def test_capture_is_the_agents_change_against_the_base_commit_without_test_configuration(
    sandboxes, repo
):
    box = sandboxes("rollout")
    agent = (
        "printf 'def add(a, b):\\n    return a + b\\n' > calc.py && "
        "printf 'import pytest\\n' > conftest.py && printf '[pytest]\\n' > pytest.ini && "
        "printf 'x = 1\\n' > tests/conftest.py && "
        "printf 'def helper():\\n    pass\\n' > util.py && "
        "git -c user.name=a -c user.email=a@b add calc.py && "
        "git -c user.name=a -c user.email=a@b commit -qm 'agent commits: HEAD moves'"
    )

    async def work(execd):
        answer = await execd.exec(agent, timeout_s=60)
        assert answer.exit_code == 0, answer.output
        captured = await capture_patch(
            execd, base_commit=repo.base_commit, excluded=["conftest.py", "pytest.ini"]
        )
        index_after = (await execd.exec("git status --porcelain", timeout_s=30)).output
        return captured, index_after

    captured, status = hs.with_execd(box.address, box.token, work)
    assert patch_paths(captured.text) == ["calc.py", "util.py"]
    assert "+    return a + b" in captured.text
    assert captured.sha256 == hashlib.sha256(captured.text.encode()).hexdigest()
    # The sandbox's own index is untouched: the new files are still untracked there.
    assert "?? util.py" in status and "?? conftest.py" in status


def test_the_reference_fix_resolves_and_the_empty_patch_does_not(sandboxes, repo):
    fixed = _grade(sandboxes, **repo.grade_kwargs())
    assert fixed.decision.verdict is Verdict.RESOLVED, fixed
    assert fixed.apply_step == "git apply --verbose"
    assert fixed.tests() == {F: "PASSED" for F in hs.F2P + hs.P2P}
    empty = _grade(sandboxes, **repo.grade_kwargs(patch=""))
    assert empty.decision.verdict is Verdict.UNRESOLVED
    assert empty.decision.fail_to_pass_not_passed == tuple(hs.F2P)
    assert empty.tests()[hs.F2P[0]] == "FAILED"


def test_a_conftest_or_an_edited_test_file_in_the_patch_cannot_make_the_tests_pass(sandboxes, repo):
    cheat_conftest = hs.diff_of(
        repo.path, "conftest.py", "import calc\n\ncalc.add = lambda a, b: a + b\n"
    )
    cheat_tests = hs.diff_of(
        repo.path, "tests/test_calc.py", hs.TESTS.replace("== 1", "== 1 or True")
    )
    for cheat in (cheat_conftest, cheat_tests):
        result = _grade(sandboxes, **repo.grade_kwargs(patch=cheat))
        assert result.apply_step is not None
        assert result.decision.verdict is Verdict.UNRESOLVED, result
        assert result.decision.fail_to_pass_not_passed == tuple(hs.F2P)


def test_a_patch_that_does_not_apply_is_a_valid_zero(sandboxes, repo):
    stale = repo.fix.replace("-    return a - b", "-    return a * b")
    result = _grade(sandboxes, **repo.grade_kwargs(patch=stale))
    assert result.decision.verdict is Verdict.UNRESOLVED
    assert result.decision.reason.startswith("patch_did_not_apply")
    assert result.apply_step is None and result.suites == ()


def test_a_fuzzy_patch_is_taken_by_a_later_step_of_the_chain(sandboxes, repo):
    # A changed context line: every git apply step refuses it, patch --fuzz takes it.
    fuzzy = repo.fix.replace(" def add(a, b):", " def add(x, y):")
    result = _grade(sandboxes, **repo.grade_kwargs(patch=fuzzy))
    assert result.apply_step == "patch --batch --forward --fuzz=5 -p1"
    assert result.decision.verdict is Verdict.RESOLVED


def test_a_suite_over_its_time_limit_is_an_infrastructure_failure_not_a_zero(sandboxes, repo):
    slow = [{"name": "slow", "command": "sleep 30", "time_limit_s": 1}]
    with pytest.raises(InfrastructureFailure, match="did not finish within 1 s"):
        _grade(sandboxes, **repo.grade_kwargs(suites=slow))
