"""``background: true`` (issue 14 item 4): a handle at once, the shell stays free,
``GET /exec/{id}`` polls status and output from an offset, ``POST /exec/{id}/signal``
signals the command's process group."""

import os
import time
from typing import Any, Callable, Dict

import pytest

from execd.tests.helpers import Client, Execd

pytestmark = pytest.mark.timeout(60)


def _until(condition: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + 30
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, "never: " + what
        time.sleep(0.01)


def _finished(client: Client, ident: str) -> Dict[str, Any]:
    return _until(
        lambda: (lambda s: s if not s["running"] else None)(client.get("/exec/" + ident)),
        "the background command ended",
    )


def test_a_background_command_answers_a_handle_and_leaves_the_shell_free(
    execd: Execd, client: Client
) -> None:
    command = "echo started; while [ ! -e gate ]; do sleep 0.01; done; echo done; exit 5"
    handle = client.exec(command, background=True)
    assert set(handle) == {"id", "pid", "background"} and handle["background"] is True
    assert client.exec("echo meanwhile")["output"] == "meanwhile\n"  # not 409 busy
    status = _until(
        lambda: (lambda s: s if s["output"] else None)(client.get("/exec/" + handle["id"])),
        "the first output",
    )
    assert status["running"] is True and "exit_code" not in status
    assert status["output"] == "started\n" and status["next_offset"] == 8
    open(os.path.join(execd.workspace, "gate"), "w").close()
    done = _finished(client, handle["id"])
    assert (done["exit_code"], done["timed_out"], done["output_bytes"]) == (5, False, 13)
    rest = client.get("/exec/%s?offset=8" % handle["id"])
    assert (rest["output"], rest["offset"], rest["next_offset"]) == ("done\n", 8, 13)


def test_signal_reaches_the_commands_process_group(execd: Execd, client: Client) -> None:
    handle = client.exec("sleep 300 & echo $! > child; wait", background=True)
    ident = handle["id"]
    child_file = os.path.join(execd.workspace, "child")
    _until(lambda: os.path.exists(child_file) and open(child_file).read().strip(), "the child")
    child = int(open(child_file).read())
    answer = client.post("/exec/%s/signal" % ident, {"signal": "TERM"})
    assert answer == {"id": ident, "signal": 15, "pid": handle["pid"]}
    done = _finished(client, ident)
    assert (done["exit_code"], done["signal"]) == (143, 15)
    _until(lambda: not _alive(child), "the group's sleep ended")
    status, err = client.request("POST", "/exec/%s/signal" % ident, {"signal": "KILL"})
    assert (status, err["error"]) == (409, "not_running")


def test_bad_ids_and_signals_are_clear_4xx(client: Client) -> None:
    status, err = client.request("GET", "/exec/0123abcd")
    assert (status, err["error"]) == (404, "unknown_command")
    ident = client.exec("sleep 300", background=True)["id"]
    status, err = client.request("POST", "/exec/%s/signal" % ident, {"signal": "NOPE"})
    assert (status, err["error"]) == (400, "bad_signal")
    status, err = client.request("GET", "/exec/%s?offset=-1" % ident)
    assert (status, err["error"]) == (400, "bad_value")
    status, err = client.request("POST", "/exec/%s" % ident, {})
    assert (status, err["error"]) == (405, "method_not_allowed")
    status, err = client.request(
        "POST", "/exec", {"command": "true", "background": True, "stream": True}
    )
    assert (status, err["error"]) == (400, "bad_request")
    client.post("/exec/%s/signal" % ident, {"signal": 9})


def test_a_background_timeout_kills_its_group(execd: Execd, client: Client) -> None:
    handle = client.exec("sleep 300 & echo $! > child; wait", background=True, timeout_s=0.5)
    done = _finished(client, handle["id"])
    assert (done["exit_code"], done["timed_out"]) == (124, True)
    child = int(open(os.path.join(execd.workspace, "child")).read())
    _until(lambda: not _alive(child), "the timed-out group's sleep ended")


def test_reset_kills_running_background_commands(client: Client) -> None:
    handle = client.exec("sleep 300", background=True)
    report = client.post("/reset")
    assert handle["pid"] in report["killed"]
    assert _finished(client, handle["id"])["signal"] == 15  # SIGTERM, then SIGKILL after grace


def test_the_output_cap_bounds_what_is_kept(client: Client) -> None:
    handle = client.exec("printf 0123456789", background=True, max_output_bytes=4)
    _finished(client, handle["id"])
    _until(lambda: client.get("/exec/" + handle["id"])["output_bytes"] == 10, "drained")
    done = client.get("/exec/" + handle["id"])
    assert (done["output"], done["dropped_bytes"]) == ("0123", 6)


def test_a_poll_never_cuts_a_utf8_character(client: Client) -> None:
    handle = client.exec("printf 'a\\xc3\\xa9b'", background=True)
    _finished(client, handle["id"])
    first = client.get("/exec/%s?max_bytes=2" % handle["id"])
    assert (first["output"], first["next_offset"]) == ("a", 1)
    second = client.get("/exec/%s?offset=1" % handle["id"])
    assert second["output"] == "\u00e9b"


def _alive(pid: int) -> bool:
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
