"""Named sessions (issue 14, item 3): ``POST /sessions`` (with a startup script),
``/exec``'s ``session``, ``POST /sessions/{name}/interrupt`` (SIGINT to that session's
foreground job only), ``GET``/``DELETE`` sessions, ``stderr: "separate"``, and no
variable of Sandman's or execd's in any command's environment."""

import os
import threading
import time
from typing import Any, Dict

import pytest

from execd.tests.helpers import Client, is_running, proc_state, read_pids

pytestmark = pytest.mark.timeout(60)


def wait_for_file(path: Any, deadline_s: float = 20.0) -> None:
    """Poll (with a deadline) until a command has written ``path``."""
    until = time.monotonic() + deadline_s
    while not (os.path.exists(str(path)) and os.path.getsize(str(path)) > 0):
        assert time.monotonic() < until, "%s never appeared" % path
        time.sleep(0.01)


class Running:
    """One /exec in a thread of its own (its own connection), answered into ``answer``."""

    def __init__(self, port: int, command: str, **kw: Any) -> None:
        self.answer = {}  # type: Dict[str, Any]
        self._thread = threading.Thread(target=self._run, args=(port, command, kw))
        self._thread.start()

    def _run(self, port: int, command: str, kw: Dict[str, Any]) -> None:
        c = Client(port)
        try:
            self.answer.update(c.exec(command, **kw))
        finally:
            c.close()

    def result(self) -> Dict[str, Any]:
        self._thread.join(30)
        assert not self._thread.is_alive(), "the command did not answer"
        return self.answer


def test_sessions_keep_their_own_state_and_run_side_by_side(execd, client, tmp_path) -> None:
    made = client.post("/sessions", {"name": "b", "startup": "export FROM_START=yes; cd /tmp"})
    assert made["name"] == "b" and made["alive"] is True and made["startup"]["exit_code"] == 0
    client.exec("X=default-x")
    client.exec("X=b-x; cd /", session="b")
    assert client.exec("echo $X $FROM_START; pwd")["output"] == "default-x\n%s\n" % (
        execd.workspace
    )
    assert client.exec("echo $X $FROM_START; pwd", session="b")["output"] == "b-x yes\n/\n"
    gate, started = tmp_path / "gate", tmp_path / "started"
    long = Running(
        execd.port,
        "echo 1 > %s; while [ ! -e %s ]; do :; done; echo done" % (started, gate),
        session="b",
    )
    wait_for_file(started)
    status, busy = client.request("POST", "/exec", {"command": "true", "session": "b"})
    assert (status, busy["error"]) == (409, "busy")  # b is busy ...
    assert client.exec("echo free")["output"] == "free\n"  # ... the default is not
    listed = {s["name"]: s for s in client.get("/sessions")["sessions"]}
    assert listed["b"]["busy"] is True and listed["default"]["busy"] is False
    assert listed["b"]["pid"] != listed["default"]["pid"]
    gate.write_text("go")
    assert long.result()["output"] == "done\n"


def test_the_startup_script_runs_again_in_every_shell_the_session_restarts(
    start_execd, tmp_path
) -> None:
    """The job's script (--startup-file, e.g. ``conda activate``) runs in every session,
    before the session's own; both run again after the shell restarts."""
    script = tmp_path / "startup.sh"
    script.write_text("export JOB_ENV=activated\nprefix() { echo job-$1; }\n")
    d = start_execd("--startup-file", str(script))
    c = d.client()
    assert c.exec("prefix default; echo $JOB_ENV")["output"] == "job-default\nactivated\n"
    c.post("/sessions", {"name": "s1", "startup": "export OWN=$JOB_ENV-own"})
    assert c.exec("echo $OWN", session="s1")["output"] == "activated-own\n"
    died = c.exec("exit 3", session="s1")
    assert died["shell_restarted"] is True and died["error_code"] == "shell_died"
    again = c.exec("echo $OWN; prefix s1", session="s1")
    assert again["output"] == "activated-own\njob-s1\n" and again["shell_restarted"] is False
    c.close()


def test_a_failing_startup_is_reported_and_the_session_still_works(client) -> None:
    made = client.post("/sessions", {"name": "bad", "startup": "echo oops >&2; false"})
    assert made["startup"]["exit_code"] == 1 and made["startup"]["output"] == "oops\n"
    assert client.exec("echo ok", session="bad")["output"] == "ok\n"


def test_interrupt_stops_only_the_sessions_foreground_job(execd, client, tmp_path) -> None:
    """SIGINT reaches b's running foreground job; b's earlier background job, another
    session's running command and b's shell (its variables) are left alone."""
    client.post("/sessions", {"name": "b"})
    client.post("/sessions", {"name": "c"})
    bg, fg, other, gate = (tmp_path / n for n in ("bg", "fg", "other", "gate"))
    client.exec("KEEP=kept; sh -c 'echo $$ > %s; exec sleep 300' &" % bg, session="b")
    wait_for_file(bg)
    in_c = Running(
        execd.port,
        "echo 1 > %s; while [ ! -e %s ]; do :; done; echo c-done" % (other, gate),
        session="c",
    )
    in_b = Running(execd.port, "sh -c 'echo $$ > %s; exec sleep 300'; echo after" % fg, session="b")
    wait_for_file(fg)
    wait_for_file(other)
    (fg_pid,) = read_pids(fg)
    fg_group = os.getpgid(fg_pid)
    sent = client.post("/sessions/b/interrupt")
    assert sent["interrupted"] is True and sent["pgid"] == fg_group
    res = in_b.result()
    assert res["exit_code"] == 130 and res["error_code"] == "interrupted"
    assert "after" not in res["output"]  # the rest of the command is abandoned
    assert res["shell_restarted"] is False
    assert proc_state(fg_pid) is None or not is_running(fg_pid)
    (bg_pid,) = read_pids(bg)
    assert is_running(bg_pid)  # the session's background job keeps running
    assert client.exec("echo $KEEP", session="b")["output"] == "kept\n"
    assert not in_c.answer  # the other session's command still runs
    gate.write_text("go")
    assert in_c.result()["output"] == "c-done\n"


def test_interrupt_unwinds_a_builtin_loop_and_is_a_no_op_when_idle(execd, client, tmp_path) -> None:
    assert client.post("/sessions/default/interrupt") == {
        "session": "default",
        "interrupted": False,
    }
    started = tmp_path / "started"
    loop = Running(execd.port, "echo 1 > %s; while :; do I=$((I+1)); done" % started)
    wait_for_file(started)
    assert client.post("/sessions/default/interrupt")["pgid"] == 0
    res = loop.result()
    assert (res["exit_code"], res["error_code"]) == (130, "interrupted")
    assert client.exec("echo ok")["output"] == "ok\n"


def test_stderr_separate_keeps_the_streams_apart_and_merged_stays_the_default(client) -> None:
    cmd = "echo out; echo err >&2; cd /nowhere"
    merged = client.exec(cmd)
    assert merged["output"].startswith("out\nerr\nbash: line 1: cd: /nowhere")
    assert "stderr" not in merged
    apart = client.exec(cmd, stderr="separate")
    assert apart["output"] == "out\n" and apart["exit_code"] == 1
    assert apart["stderr"].startswith("err\nbash: line 1: cd: /nowhere: No such file")
    assert apart["stderr_bytes"] >= len(apart["stderr"].encode())  # counted before scrubbing
    syntax = client.exec('echo "open', stderr="separate", isolate=True)
    assert syntax["error_code"] == "syntax_error" and syntax["output"] == ""
    assert "unexpected EOF" in syntax["stderr"]
    capped = client.exec(
        "head -c 5000 /dev/zero | tr '\\0' e >&2", stderr="separate", max_output_bytes=1000
    )
    assert capped["stderr_bytes"] == 5000 and len(capped["stderr"]) < 1200


def test_no_variable_of_sandmans_reaches_any_session(start_execd, tmp_path) -> None:
    env = dict(os.environ, SANDMAN_SANDBOX="sb-7", SANDMAN_EXECD_PYTHON="python3")
    d = start_execd(env=env)
    c = d.client()
    c.post("/sessions", {"name": "other"})
    for session in ("default", "other"):
        for isolate in (False, True):
            out = c.exec("env", session=session, isolate=isolate)["output"]
            names = [line.split("=", 1)[0] for line in out.splitlines()]
            assert "PATH" in names
            assert not [n for n in names if n.startswith("SANDMAN")], (session, names)
    assert not [k for k in c.get("/env")["env"] if k.startswith("SANDMAN")]
    c.close()


def test_deleting_a_session_kills_its_processes_and_answers_its_command(
    execd, client, tmp_path
) -> None:
    client.post("/sessions", {"name": "gone"})
    kept, child, started = tmp_path / "kept", tmp_path / "child", tmp_path / "started"
    client.exec("sh -c 'echo $$ > %s; exec sleep 300' &" % kept)  # the default session's
    wait_for_file(kept)
    client.exec("sh -c 'echo $$ > %s; exec sleep 300' &" % child, session="gone")
    wait_for_file(child)
    running = Running(execd.port, "echo 1 > %s; sleep 300" % started, session="gone")
    wait_for_file(started)
    deleted = client.request("DELETE", "/sessions/gone")[1]
    (child_pid,) = read_pids(child)
    assert deleted["session"] == "gone" and child_pid in deleted["killed"]
    assert running.result()["error_code"] == "session_closed"
    assert proc_state(child_pid) is None
    assert is_running(read_pids(kept)[0])  # another session's processes stay
    status, body = client.request("POST", "/exec", {"command": "true", "session": "gone"})
    assert (status, body["error"]) == (404, "no_session")
    assert [s["name"] for s in client.get("/sessions")["sessions"]] == ["default"]


def test_a_session_shell_that_exits_does_not_touch_another_sessions_processes(
    client, tmp_path
) -> None:
    client.post("/sessions", {"name": "a"})
    other, mine = tmp_path / "other", tmp_path / "mine"
    client.exec("sh -c 'echo $$ > %s; exec sleep 300' &" % other)
    client.exec("sh -c 'echo $$ > %s; exec sleep 300' &" % mine, session="a")
    wait_for_file(other)
    wait_for_file(mine)
    assert client.exec("exit 4", session="a")["shell_restarted"] is True
    assert proc_state(read_pids(mine)[0]) is None  # its own background job went with it
    assert is_running(read_pids(other)[0])


def test_reset_kills_every_session_and_restarts_each_with_its_startup(client, tmp_path) -> None:
    client.post("/sessions", {"name": "r", "startup": "export AGAIN=yes"})
    pid_file = tmp_path / "p"
    client.exec(
        "export AGAIN=changed; sh -c 'echo $$ > %s; exec sleep 300' &" % pid_file, session="r"
    )
    wait_for_file(pid_file)
    (pid,) = read_pids(pid_file)
    report = client.post("/reset")
    assert pid in report["killed"] and report["survivors"] == []
    assert proc_state(pid) is None
    assert client.exec("echo $AGAIN", session="r")["output"] == "yes\n"


@pytest.mark.parametrize(
    "method, path, body, status, code",
    [
        ("POST", "/sessions", {"name": "bad name"}, 400, "bad_value"),
        ("POST", "/sessions", {"name": ""}, 400, "bad_value"),
        ("POST", "/sessions", {"name": "x" * 65}, 400, "bad_value"),
        ("POST", "/sessions", {"name": "ok", "startup": 5}, 400, "bad_type"),
        ("POST", "/sessions", {"name": "ok", "startup_timeout_s": 0}, 400, "bad_value"),
        ("POST", "/sessions", {"name": "ok", "extra": 1}, 400, "unknown_field"),
        ("POST", "/sessions", {"name": "default"}, 409, "session_exists"),
        ("DELETE", "/sessions/default", None, 400, "default_session"),
        ("DELETE", "/sessions/nope", None, 404, "no_session"),
        ("POST", "/sessions/nope/interrupt", None, 404, "no_session"),
        ("GET", "/sessions/nope/interrupt", None, 405, "method_not_allowed"),
        ("POST", "/exec", {"command": "true", "session": "nope"}, 404, "no_session"),
        ("POST", "/exec", {"command": "true", "stderr": "both"}, 400, "bad_value"),
        ("POST", "/exec", {"command": "true", "session": "a/b"}, 400, "bad_value"),
    ],
)
def test_bad_session_requests_get_a_clear_4xx(
    client, method: str, path: str, body: Any, status: int, code: str
) -> None:
    got_status, got = client.request(method, path, body)
    assert (got_status, got["error"]) == (status, code), got
    assert got["detail"]


def test_the_session_limit_is_a_409_naming_it(start_execd) -> None:
    d = start_execd("--max-sessions", "2")
    c = d.client()
    c.post("/sessions", {"name": "one"})
    status, body = c.request("POST", "/sessions", {"name": "two"})
    assert (status, body["error"], body["limit"]) == (409, "too_many_sessions", 2)
    c.request("DELETE", "/sessions/one")
    assert c.post("/sessions", {"name": "two"})["alive"] is True
    names = [s["name"] for s in c.get("/sessions")["sessions"]]
    assert names == ["default", "two"]
    c.close()


def test_an_interrupt_sent_as_soon_as_the_session_is_busy_is_never_lost(execd, client) -> None:
    """An agent framework interrupts as soon as the session says it is busy (SWE-ReX's
    ``BashInterruptAction``): that can be before bash has read the command, or before it
    forked the command's first job. The interrupt must still stop that command, not
    vanish and leave it running to its timeout."""
    for _ in range(12):
        running = Running(execd.port, "sleep 20; echo after", timeout_s=8)
        until = time.monotonic() + 10
        while not any(
            s["name"] == "default" and s["busy"] for s in client.get("/sessions")["sessions"]
        ):
            assert time.monotonic() < until, "the command never started"
        sent = client.post("/sessions/default/interrupt")
        assert sent["interrupted"] is True
        res = running.result()
        assert (res["exit_code"], res["error_code"]) == (130, "interrupted"), res
        assert "after" not in res["output"]
    assert client.exec("echo ok")["output"] == "ok\n"
