"""mini-swe-agent on Sandman, unchanged (issue 14, item 1): its ``DefaultAgent`` with its
deterministic model runs one scripted loop on a Sandman sandbox (the environment chosen by
dotted path, as in a YAML config; the real controller, local provider and execd behind a
live server) and the same loop on mini-swe-agent's own ``LocalEnvironment``; return codes
and outputs are compared step by step.

Intended differences (asserted as such, not hidden):
* ``echo "open`` - both exit 2, but the diagnostic is the shell's own: bash's (Sandman's
  sandbox shell) vs ``/bin/sh``'s (LocalEnvironment runs ``shell=True``, dash on Debian).
* a timeout - both ``returncode -1`` with the same ``exception_info``; Sandman's output
  also carries bash's "Terminated" notice of the killed foreground command.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from minisweagent.agents.default import DefaultAgent
from minisweagent.environments import get_environment
from minisweagent.environments.local import LocalEnvironment
from minisweagent.exceptions import Submitted
from minisweagent.models.test_models import DeterministicModel, make_output

from sandboxes.tests.api_support import make_user

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]

STEPS = [
    "mkdir -p proj && cd proj && printf 'x = 1\\n' > a.py && cat a.py",
    "ls",  # the cd above did not last: proj, not a.py
    "export FOO=bar; exit 3",
    "echo ${FOO:-unset}; set -e; false; echo unreached",
    "echo $((6 * 7)) >&2; echo out",
    'echo "open',
    "sleep 5",
    "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT; cat proj/a.py",
]
SHELL_DIAGNOSTIC = 5  # index of the step whose message is the shell's own
TIMEOUT = 6

YAML = """
environment:
  environment_class: sandboxes.integrations.mini_swe_agent.SandmanEnvironment
  image: sandman/empty
  spec: {cpu: 500m, memory: 256Mi}
  timeout: 2
  acquire_timeout_s: 60
"""


class Recorder:
    """Wraps an environment (composition): the agent's calls go through, results are kept."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self.results: list[dict[str, Any]] = []

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict:
        try:
            result = self.env.execute(action, cwd, timeout=timeout)
        except Submitted as done:  # record what the submit step printed
            self.results.append({"submitted": done.messages[0]["extra"]["submission"]})
            raise
        self.results.append(result)
        return result

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        return self.env.get_template_vars(**kwargs)

    def serialize(self) -> dict:
        return self.env.serialize()


def run_loop(env: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    model = DeterministicModel(
        outputs=[make_output(f"step {i}", [{"command": c}]) for i, c in enumerate(STEPS)]
    )
    recorder = Recorder(env)
    agent = DefaultAgent(
        model,
        recorder,
        system_template="scripted",
        instance_template="{{task}}",
        step_limit=20,
        cost_limit=100.0,
    )
    return agent.run("run the script"), recorder.results


def test_the_scripted_loop_matches_mini_swe_agents_local_environment(
    controller, live_server, tmp_path, monkeypatch
):
    _, token = make_user("mini-user")
    monkeypatch.setenv("SANDMAN_URL", live_server.url)
    monkeypatch.setenv("SANDMAN_TOKEN", token)
    sandman_env = get_environment(yaml.safe_load(YAML)["environment"])
    try:
        sandman_exit, sandman = run_loop(sandman_env)
    finally:
        sandman_env.close()
    local_exit, local = run_loop(LocalEnvironment(cwd=str(tmp_path), timeout=2))

    assert sandman_exit["exit_status"] == local_exit["exit_status"] == "Submitted"
    assert sandman_exit["submission"] == local_exit["submission"] == "x = 1\n"
    assert len(sandman) == len(local) == len(STEPS)
    for i, (ours, theirs) in enumerate(zip(sandman[:-1], local[:-1], strict=True)):
        assert ours["returncode"] == theirs["returncode"], (i, STEPS[i], ours, theirs)
        if i == SHELL_DIAGNOSTIC:
            assert ours["returncode"] == 2
            assert ours["output"].startswith("bash: line 1: unexpected EOF")
            assert theirs["output"].startswith("/bin/sh: 1: Syntax error")
        elif i == TIMEOUT:
            assert ours["returncode"] == -1
            assert ours["exception_info"] == theirs["exception_info"]
            assert ours["output"] in ("", "Terminated\n")
        else:
            assert ours["output"] == theirs["output"], (i, STEPS[i], ours, theirs)
    assert [r["output"] for r in sandman[:5]] == ["x = 1\n", "proj\n", "", "unset\n", "42\nout\n"]


def test_bash_env_in_the_config_is_sourced_before_every_action(controller, live_server):
    """mini-swe-agent's SWE-bench config activates its conda environment through
    ``BASH_ENV``, which every ``bash -c`` of ``LocalEnvironment`` sources: on Sandman the
    actions run in a session whose startup script sources it (issue 14)."""
    from sandboxes.client import Client
    from sandboxes.integrations.mini_swe_agent import SandmanEnvironment

    _, token = make_user("mini-bash-env")
    with Client(live_server.url, token) as client:
        job = client.job(name="mini-bash-env", egress="allow")
        with job.acquire(image="sandman/empty", spec={"cpu": "500m", "memory": "256Mi"}) as sb:
            sb.write("/tmp/activate.sh", "export CONDA_DEFAULT_ENV=testbed\nactive() { :; }\n")
            env = SandmanEnvironment(sandbox=sb, env={"BASH_ENV": "/tmp/activate.sh", "K": "v"})
            first = env.execute({"command": "active && echo $CONDA_DEFAULT_ENV $K"})
            assert (first["output"], first["returncode"]) == ("testbed v\n", 0)
            env.execute({"command": "unset CONDA_DEFAULT_ENV; export K=changed"})
            again = env.execute({"command": "echo $CONDA_DEFAULT_ENV $K"})
            assert again["output"] == "testbed v\n"  # each action starts from the activation
            assert sb.run("echo ${CONDA_DEFAULT_ENV:-plain}").output == "plain\n"
            env.close()
            assert [s["name"] for s in sb.sessions()] == ["default"]
