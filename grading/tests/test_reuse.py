"""Checked reuse of grading sandboxes against a poisoned tenant (paper Table A34, Appendix I).

Three arms grade the same patches: a fresh sandbox per grading (the truth), checked reuse
(the controller resets, checks and restores a released grading sandbox and hands it out
again, ``source == "reused"``), and plain reuse (execd's ``/reset`` plus ``git reset
--hard`` and ``git clean``, no state check). Before each graded patch, a tenant poisons
its sandbox; checked reuse must then grade exactly like fresh, and plain reuse gets it
wrong. Real execd over HTTP, the local backend, real git, pytest and PostgreSQL.
"""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from grading.harness import InfrastructureFailure, grade_patch, sha256_text
from grading.models import Grading
from grading.runner import DEFAULT_CPU_MILLIS, DEFAULT_MEMORY_BYTES, GradingRunner
from grading.tests import harness_support as hs
from grading.tests.support import instance
from sandboxes.providers.local import procs
from sandboxes.tests.api_support import api, make_job
from sandboxes.tests.controller_support import execd, state, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

# The image's own interpreter runs the suite, as in a SWE-bench image: its user site is
# the sandbox's (``$HOME/.local``), so a tenant can leave its customize modules there.
SYSTEM_PYTEST = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest -rA -p no:cacheprovider"
SUITE = {"name": "unit", "command": SYSTEM_PYTEST, "time_limit_s": 120}
KEY = dict(cpu_millis=DEFAULT_CPU_MILLIS, memory_bytes=DEFAULT_MEMORY_BYTES, workspace_bytes=None)
GIT_ID = "-c user.email=tenant@example.com -c user.name=tenant"


def _poisons(fixed: str) -> dict[str, str]:
    """Each poison a tenant leaves, as the shell commands it runs in its sandbox."""
    body = shlex.quote(fixed)
    return {
        # HEAD moved to a commit holding the fix: git reset --hard keeps it.
        "moved_head": f"printf %s {body} > calc.py && git {GIT_ID} commit -qam fixed",
        # A tracked file edited behind skip-worktree: git reset --hard leaves it alone.
        "edited_tracked_file": (
            f"git update-index --skip-worktree calc.py && printf %s {body} > calc.py"
        ),
        # A customize module in python3's user site (under $HOME): every later python3
        # (the grader's pytest too) exits before it runs a test. usercustomize.py, the user
        # site's sitecustomize.py: Debian's python3 ships a sitecustomize.py of its own,
        # which would shadow one in the user site.
        "sitecustomize": (
            "site=$(python3 -c 'import site; print(site.getusersitepackages())') && "
            'mkdir -p "$site" && '
            "printf 'import os\\nos._exit(3)\\n' > \"$site/usercustomize.py\""
        ),
    }


def _stray_process(fixed: str) -> str:
    """A detached process that keeps writing the fix back (execd's /reset kills it)."""
    body = shlex.quote(fixed)
    loop = f"while :; do printf %s {body} > calc.py; sleep 0.05; done"
    return (
        f"{{ setsid sh -c {shlex.quote(loop)} > /dev/null 2>&1 < /dev/null & }} && "
        'printf "%s" "$!" > "$HOME/stray.pid"'
    )


def _sh(box: Any, command: str) -> dict[str, Any]:
    answer = execd(box.address, box.token, "/exec", {"command": command, "timeout_s": 60})
    assert answer["exit_code"] == 0, (command, answer)
    return answer


def _task(token: str, repo: hs.TaskRepo) -> None:
    body = instance(
        instance_id="calc-1",
        base_commit=repo.base_commit,
        patch=repo.fix,
        test_patch=repo.test_patch,
        image=repo.image,
        FAIL_TO_PASS=hs.F2P,
        PASS_TO_PASS=hs.P2P,
        suites=[SUITE],
    )
    response = api(token).post("/api/v1/tasks/", body, format="json")
    assert response.status_code == 201, response.content


def _graded(runner: GradingRunner, token: str, job_id: int, patch: str) -> dict[str, Any]:
    """Grade ``patch`` through REST and the runner: (verdict, source) of its one attempt."""
    response = api(token).post(
        "/api/v1/gradings/", {"job": job_id, "task": "calc-1", "patch": patch}, format="json"
    )
    assert response.status_code == 202, response.content
    assert runner.run_once() is True
    grading = Grading.objects.get(pk=response.json()["id"])
    [attempt] = grading.attempts
    return {"verdict": grading.verdict, "source": attempt["source"], "box": attempt["sandbox_id"]}


def _plain_reuse_verdict(box: Any, repo: hs.TaskRepo, patch: str) -> str:
    """The paper's plain reuse: execd's /reset, then git reset --hard and git clean.

    The verdict it grades, or ``infrastructure_failure`` when the harness cannot even
    reset the box to the base commit: with the moved HEAD AND a skip-worktree entry edited
    behind git's back ("all four"), ``git reset --hard <base>`` refuses ("Entry 'calc.py'
    not uptodate. Cannot merge.") when git's stat check sees the edit. That happened in 1 of
    4 clean-clone CI runs: it depends on timing, most likely the file's mtime against the
    index's (git's racy-clean rule, https://git-scm.com/docs/racy-git). Either way, plain
    reuse does not give the fresh verdict."""
    execd(box.address, box.token, "/reset", {})
    _sh(box, "git reset -q --hard && git clean -fdq")
    kwargs = repo.grade_kwargs(patch=patch, suites=[SUITE])
    try:
        result = hs.with_execd(box.address, box.token, lambda client: grade_patch(client, **kwargs))
    except InfrastructureFailure as failure:
        assert "could not reset to the base commit" in str(failure), failure
        return "infrastructure_failure"
    return result.decision.verdict.value


def test_a_poisoned_tenant_fools_plain_reuse_but_not_checked_reuse(
    grading_controller, grader, repo
):
    """Table A34: after a poisoned tenant, checked reuse grades the next patch exactly like a
    fresh sandbox; plain reuse (execd reset + git reset and clean) grades it wrongly."""
    user, token = grader
    _task(token, repo)
    fresh_job = make_job(user, name="fresh", egress="allow")
    reuse_job = make_job(user, name="checked", egress="allow", reuse_enabled=True)
    plain_job = make_job(user, name="plain", egress="allow")
    runner = GradingRunner(controller=grading_controller, acquire_timeout_s=60)
    fixed = hs.CALC_FIXED
    truth = {
        "empty": _graded(runner, token, fresh_job.pk, "")["verdict"],
        "fix": _graded(runner, token, fresh_job.pk, repo.fix)["verdict"],
    }
    assert truth == {"empty": "unresolved", "fix": "resolved"}
    patches = {"empty": "", "fix": repo.fix}

    poisons = _poisons(fixed)
    combined = " && ".join([*poisons.values(), _stray_process(fixed)])
    # (poison, the patch graded next: the one the poison flips)
    cases = [
        ("all four", combined, "fix"),
        ("moved_head", poisons["moved_head"], "empty"),
        ("edited_tracked_file", poisons["edited_tracked_file"], "empty"),
        ("sitecustomize", poisons["sitecustomize"], "fix"),
    ]
    acquire = dict(image=repo.image, base_commit=repo.base_commit, role="grading", **KEY)
    seen: dict[str, dict[str, str]] = {}
    for name, poison, victim in cases:
        # Checked reuse: the tenant poisons a grading sandbox of the reuse job and releases
        # it with its verdict; the controller checks and restores it; the next grading
        # gets that same sandbox back ("reused").
        tenant = grading_controller.acquire(job_id=reuse_job.pk, timeout_s=60, **acquire)
        _sh(tenant, poison)
        grading_controller.release(
            sandbox_id=tenant.sandbox_id,
            verdict="pass",
            patch_sha256=sha256_text(f"tenant {name}"),
            suite="calc-1:unit",
        )
        box_id = tenant.sandbox_id
        wait_until(lambda: state(box_id) == "ready", what="the tenant's box reused")  # noqa: B023
        checked = _graded(runner, token, reuse_job.pk, patches[victim])
        assert (checked["source"], checked["box"]) == ("reused", tenant.sandbox_id)

        # Plain reuse: the same poison, then only execd's reset and git's.
        box = grading_controller.acquire(job_id=plain_job.pk, timeout_s=60, **acquire)
        _sh(box, poison)
        plain = _plain_reuse_verdict(box, repo, patches[victim])
        if name == "all four":  # the stray process: execd's reset killed it in both arms
            pid = int(_sh(box, 'cat "$HOME/stray.pid"')["output"])
            assert procs.state(pid) in (None, "Z")
        grading_controller.release(sandbox_id=box.sandbox_id)
        seen[name] = {"fresh": truth[victim], "checked": checked["verdict"], "plain": plain}

    for name, verdicts in seen.items():
        assert verdicts["checked"] == verdicts["fresh"], (name, seen)
        assert verdicts["plain"] != verdicts["fresh"], (name, seen)


def test_a_sandbox_without_isolation_checks_only_its_own_directories(sandboxes):
    """Without isolation /tmp, /etc and the system's packages are the host's, shared with
    every other program: a restore there would rewrite their files. The state check covers
    the sandbox's home and its repositories only."""
    box = sandboxes("grading")
    home = _sh(box, 'printf %s "$HOME"')["output"]
    if not home.endswith("/private/home"):
        pytest.skip(f"sandboxes are isolated here (HOME={home}): /tmp and /etc are their own")
    answer = execd(box.address, box.token, "/state/baseline", {})
    assert (answer["roots"], answer["site_packages"]) == ([home], [])
    assert answer["repos"] == [_sh(box, "pwd")["output"].strip()]
