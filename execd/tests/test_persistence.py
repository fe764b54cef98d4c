"""One persistent bash keeps cwd, environment, functions and background
processes across calls (paper §3.1); every command's stdin is /dev/null."""

import os

import pytest

from execd.tests.helpers import Client, Execd, is_running, read_pids

pytestmark = pytest.mark.timeout(60)


def test_cwd_exported_variables_and_functions_survive_across_calls(
    client: Client, tmp_path
) -> None:
    d = tmp_path / "sub dir"
    d.mkdir()
    assert (
        client.exec("cd %r && export GREETING='hi there' && plain=kept" % str(d))["exit_code"] == 0
    )
    assert client.exec('greet() { echo "$GREETING from $(basename "$PWD")"; }')["exit_code"] == 0
    assert client.exec("declare -A colours=([sky]=blue); declare -a nums=(1 2 3)")["exit_code"] == 0
    res = client.exec("pwd; greet; echo $plain ${colours[sky]} ${nums[2]}; env | grep '^GREETING='")
    assert res["exit_code"] == 0
    assert res["output"] == "%s\nhi there from sub dir\nkept blue 3\nGREETING=hi there\n" % d


def test_background_process_survives_across_calls(client: Client, tmp_path) -> None:
    pidfile = tmp_path / "bg.pid"
    res = client.exec(
        "(echo $BASHPID > %s; exec sleep 300) & while [ ! -s %s ]; do :; done; "
        "echo started" % (pidfile, pidfile)
    )
    assert res["output"] == "started\n"
    (pid,) = read_pids(pidfile)
    client.exec("true")
    assert is_running(pid)
    assert client.exec("jobs -p | wc -l")["output"].strip() == "1"
    out = client.exec("kill %d; wait %d; echo $?" % (pid, pid))["output"]
    assert out.endswith("143\n")  # bash also notes "[1]+ Terminated ..." as in any script


def test_exit_status_output_and_stderr_are_reported(client: Client) -> None:
    res = client.exec("echo out; echo err >&2; exit_code_is() { return $1; }; exit_code_is 7")
    assert res["exit_code"] == 7
    assert res["output"] == "out\nerr\n"
    assert res["output_bytes"] == 8 and res["truncated"] is False
    assert res["duration_ms"] > 0 and "error" not in res


def test_cwd_field_runs_the_command_there_relative_to_the_workspace(
    execd: Execd, client: Client
) -> None:
    os.makedirs(os.path.join(execd.workspace, "pkg", "src"))
    assert (
        client.exec("pwd", cwd="pkg/src")["output"]
        == os.path.join(execd.workspace, "pkg", "src") + "\n"
    )
    assert client.exec("pwd", cwd="/")["output"] == "/\n"


def test_a_command_that_exits_the_shell_is_reported_and_the_next_runs_in_a_new_shell(
    client: Client,
) -> None:
    client.exec("export KEEP=1")
    res = client.exec("echo bye; exit 3")
    assert res["exit_code"] == 3 and res["output"] == "bye\n"
    assert "exited with status 3" in res["error"] and res["shell_restarted"] is True
    again = client.exec("echo ${KEEP:-gone}")
    assert again["exit_code"] == 0 and again["output"] == "gone\n"


@pytest.mark.parametrize(
    "command",
    [
        "cat",
        "python3",
        "read x; echo read=$?",
        "head -c 10",
        "bash -c 'read y'; echo nested=$?",
    ],
)
def test_stdin_is_dev_null_so_readers_return_at_once(client: Client, command: str) -> None:
    """6b: no command can read the daemon's command channel or wait on a terminal."""
    res = client.exec(command, timeout_s=10)
    assert res["exit_code"] in (0, 1), res
    assert "error" not in res
    assert res["duration_ms"] < 10000


def test_a_backgrounded_reader_also_gets_dev_null(client: Client, tmp_path) -> None:
    out = tmp_path / "bg.out"
    client.exec('(cat; echo "cat=$?") > %s 2>&1 & wait' % out)
    assert out.read_text() == "cat=0\n"
    assert client.exec("ls -l /proc/$$/fd/0")["output"].rstrip().endswith("/dev/null")
