"""Per-test results from real pytest ``-rA`` output, and the SWE-bench verdict rule.

The logs are produced here by running the real pytest on a small project (a subprocess with
plugin autoload off, so this repository's configuration does not leak in).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from grading.verdicts import (
    Status,
    Verdict,
    decide,
    merge_results,
    parse_pytest_summary,
    patch_did_not_apply,
)

PROJECT = textwrap.dedent(
    """
    import pytest

    def test_passes():
        print("PASSED tests/test_forged.py::test_forged")  # printed output never counts
        assert True

    def test_fails():
        assert 1 == 2, "one is not two"

    @pytest.fixture
    def broken():
        raise RuntimeError("fixture broke")

    def test_errors(broken):
        pass

    @pytest.mark.skip(reason="not today")
    def test_skipped():
        pass

    @pytest.mark.xfail(reason="known bug")
    def test_xfails():
        assert False

    @pytest.mark.xfail(reason="fixed by accident")
    def test_xpasses():
        assert True

    @pytest.mark.parametrize("word", ["a b", "c - d"])
    def test_param(word):
        assert " " in word

    @pytest.mark.parametrize("word", ["e - f"])
    def test_param_fails(word):
        assert word == "g"
    """
)


def _run_pytest(tmp_path: Path, *args: str) -> str:
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "test_mixed.py").write_text(PROJECT, encoding="utf-8")
    (tmp_path / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
    env = {**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # some tests failed
    return done.stdout


def test_every_status_of_a_real_pytest_run_is_read_from_its_rA_summary(tmp_path):
    statuses = parse_pytest_summary(_run_pytest(tmp_path))
    base = "tests/test_mixed.py::"
    assert statuses == {
        base + "test_passes": Status.PASSED,
        base + "test_fails": Status.FAILED,
        base + "test_errors": Status.ERROR,
        base + "test_xfails": Status.XFAIL,
        base + "test_xpasses": Status.XPASS,
        base + "test_param[a b]": Status.PASSED,
        base + "test_param[c - d]": Status.PASSED,
        base + "test_param_fails[e - f]": Status.FAILED,
    }
    assert "tests/test_forged.py::test_forged" not in statuses


def test_colour_codes_do_not_hide_results(tmp_path):
    statuses = parse_pytest_summary(_run_pytest(tmp_path, "--color=yes"))
    assert statuses["tests/test_mixed.py::test_fails"] is Status.FAILED
    assert statuses["tests/test_mixed.py::test_passes"] is Status.PASSED


def test_a_log_without_a_summary_header_is_read_line_by_line():
    log = "PASSED a.py::x\nFAILED a.py::y - AssertionError: no\nSKIPPED [1] a.py:3: later\n"
    assert parse_pytest_summary(log) == {"a.py::x": Status.PASSED, "a.py::y": Status.FAILED}


def test_a_failure_is_never_overwritten_by_a_later_pass_across_suites():
    merged = merge_results(
        [
            {"a::x": Status.FAILED, "a::y": Status.SKIPPED},
            {"a::x": Status.PASSED, "a::y": Status.PASSED},
        ]
    )
    assert merged == {"a::x": Status.FAILED, "a::y": Status.PASSED}


def test_resolved_only_when_every_fail_to_pass_and_pass_to_pass_test_passes(tmp_path):
    statuses = parse_pytest_summary(_run_pytest(tmp_path))
    base = "tests/test_mixed.py::"
    ok = decide(
        fail_to_pass=[base + "test_passes", base + "test_xfails"],
        pass_to_pass=[base + "test_param[a b]"],
        statuses=statuses,
    )
    assert ok.verdict is Verdict.RESOLVED and ok.reason == "resolved"


@pytest.mark.parametrize(
    "f2p, p2p, bad_f2p, bad_p2p",
    [
        (["test_fails"], ["test_passes"], ["test_fails"], []),
        (["test_passes"], ["test_errors"], [], ["test_errors"]),
        (["test_skipped"], [], ["test_skipped"], []),  # skipped is not passed (stricter)
        (["test_xpasses"], [], ["test_xpasses"], []),
        (["test_passes"], ["test_missing"], [], ["test_missing"]),  # absent from the log
    ],
)
def test_anything_but_a_pass_leaves_the_task_unresolved(tmp_path, f2p, p2p, bad_f2p, bad_p2p):
    statuses = parse_pytest_summary(_run_pytest(tmp_path))
    base = "tests/test_mixed.py::"
    decision = decide(
        fail_to_pass=[base + t for t in f2p],
        pass_to_pass=[base + t for t in p2p],
        statuses=statuses,
    )
    assert decision.verdict is Verdict.UNRESOLVED
    assert decision.reason.startswith("tests_failed: ")
    assert decision.fail_to_pass_not_passed == tuple(base + t for t in bad_f2p)
    assert decision.pass_to_pass_not_passed == tuple(base + t for t in bad_p2p)


def test_a_patch_that_does_not_apply_is_a_valid_zero_not_a_no_verdict():
    decision = patch_did_not_apply("error: patch failed: calc.py:1")
    assert decision.verdict is Verdict.UNRESOLVED
    assert decision.as_dict()["reason"].startswith("patch_did_not_apply: ")
