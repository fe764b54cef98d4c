"""``/exec`` additions agent frameworks need (issue 14, item 2), one test per trial finding:
``isolate``, a cwd for one call only, machine-readable failures (``timed_out``,
``error_code``), bash's own wording instead of execd's private path, no job notice of a
timed-out command in a later answer, and ``max_output_bytes`` bounded by the job's limit.
"""

import os

import pytest

from execd.tests.helpers import Client, Execd, is_running

pytestmark = pytest.mark.timeout(120)


def test_isolated_commands_see_the_shell_state_but_cannot_change_it(
    execd: Execd, client: Client
) -> None:
    client.exec("export SEEN=yes; shown() { echo fn; }; cd /tmp")
    res = client.exec("echo $SEEN; shown; pwd; cd /; export LEAK=1; leak() { :; }", isolate=True)
    assert res["output"] == "yes\nfn\n/tmp\n" and res["exit_code"] == 0
    after = client.exec("pwd; echo ${LEAK:-none}; type -t leak || echo nofn")
    assert after["output"] == "/tmp\nnone\nnofn\n"


def test_an_isolated_command_has_the_plain_calls_fds(client: Client) -> None:
    """stderr joined to the output, stdin /dev/null, none of execd's own fds (status 40,
    /dev/null 42, stderr pipe 43) open: the same as a plain call."""
    command = "echo err >&2; echo out; ls /proc/self/fd | sort -n | tr '\\n' ' '"
    plain, isolated = client.exec(command), client.exec(command, isolate=True)
    assert isolated["output"] == plain["output"]
    assert isolated["output"].startswith("err\nout\n0 1 2 3 ")
    assert not {"40", "42", "43"} & set(isolated["output"].split())


@pytest.mark.parametrize(
    "command, code",
    [("exit 3", 3), ("set -e; false; echo unreached", 1), ("set -u; echo $UNSET_VAR", 1)],
    ids=["exit", "set-e", "set-u"],
)
def test_an_isolated_exit_or_set_e_ends_the_call_not_the_shell(
    execd: Execd, client: Client, command: str, code: int
) -> None:
    """The trial's scripted agent lost its background server and cwd to ``exit N``."""
    client.exec("cd /tmp; sleep 300 & echo $! > %s/server.pid" % execd.workspace)
    server = int(open(os.path.join(execd.workspace, "server.pid")).read())
    res = client.exec(command, isolate=True)
    assert res["exit_code"] == code and res["shell_restarted"] is False
    assert "unreached" not in res["output"] and "error_code" not in res
    assert client.exec("pwd; echo $-")["output"].startswith("/tmp\n")
    assert "e" not in client.exec("echo $-")["output"]
    assert is_running(server)


def test_cwd_applies_to_that_call_only(execd: Execd, client: Client) -> None:
    """Trial: ``run("pwd", cwd="/tmp")`` then ``run("pwd")`` printed /tmp."""
    assert client.exec("pwd", cwd="/tmp")["output"] == "/tmp\n"
    assert client.exec("pwd")["output"] == execd.workspace + "\n"
    client.exec("cd /usr")
    assert client.exec("cd /; pwd", cwd="/tmp")["output"] == "/\n"
    assert client.exec("pwd; cd -")["output"] == "/usr\n" + execd.workspace + "\n"


def test_execd_timeout_is_flagged_apart_from_a_command_exiting_124(client: Client) -> None:
    own = client.exec("timeout 0.2 sleep 5")
    assert own["exit_code"] == 124 and own["timed_out"] is False and "error_code" not in own
    ours = client.exec("sleep 5", timeout_s=0.3)
    assert ours["exit_code"] == 124 and ours["timed_out"] is True
    assert ours["error_code"] == "timeout" and ours["shell_restarted"] is False


def test_error_codes_name_each_failure(execd: Execd, client: Client) -> None:
    assert client.exec("echo 'open")["error_code"] == "syntax_error"
    os.makedirs(os.path.join(execd.workspace, "d"))
    client.exec("chmod 000 d")
    if os.geteuid() != 0:  # root enters a mode-000 directory
        assert client.exec("true", cwd="d")["error_code"] == "cwd_failed"
    died = client.exec("exit 4")
    assert died["error_code"] == "shell_died" and died["shell_restarted"] is True
    assert "error_code" not in client.exec("false")


def test_messages_say_bash_not_execds_command_file(execd: Execd, client: Client) -> None:
    """Trial: ``/run/sandman/execd/command: line 1: cd: nowhere: ...``."""
    res = client.exec("cd nowhere")
    assert res["output"] == "bash: line 1: cd: nowhere: No such file or directory\n"
    assert client.exec("echo $BASH_SOURCE")["output"] == "bash\n"
    killed = client.exec("sleep 30 & kill -9 $!; wait $!; echo rc=$?")
    assert execd.run_dir not in killed["output"] and "rc=137" in killed["output"]


def test_no_notice_of_a_job_killed_by_a_timeout_reaches_a_later_answer(client: Client) -> None:
    """Trial: in 2 of 5 runs the background job's "Terminated" notice landed in the NEXT
    command's output. Ten runs here."""
    for _ in range(10):
        res = client.exec("sleep 100 & sleep 5", timeout_s=0.2)
        assert res["timed_out"] is True
        assert client.exec("echo next")["output"] == "next\n"


def test_max_output_bytes_caps_one_call_within_the_jobs_limit(
    start_execd: "object",
) -> None:
    execd = start_execd("--max-output-bytes", "200000")  # type: ignore[operator]
    client = execd.client()
    try:
        small = client.exec("head -c 5000 /dev/zero", max_output_bytes=100)
        assert small["truncated"] is True and small["output_bytes"] == 5000
        assert small["dropped_bytes"] == 4900
        big = client.exec("head -c 150000 /dev/zero", max_output_bytes=200000)
        assert big["truncated"] is False and len(big["output"]) == 150000
        default = client.exec("head -c 150000 /dev/zero")  # --output-cap, 100 KiB
        assert default["truncated"] is True
        status, body = client.request(
            "POST", "/exec", {"command": "true", "max_output_bytes": 200001}
        )
        assert status == 400 and body["error"] == "bad_value" and body["limit"] == 200000
        status, body = client.request("POST", "/exec", {"command": "true", "isolate": "yes"})
        assert status == 400 and body["error"] == "bad_type"
    finally:
        client.close()
