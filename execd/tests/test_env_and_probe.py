"""GET/POST /env work on the persistent shell; GET /probe reports run conditions,
each field read from a named source or declared unreadable - never guessed."""

import os
import socket

import pytest

from execd.tests.helpers import Client

pytestmark = pytest.mark.timeout(60)


def test_env_reads_and_changes_the_persistent_shell(client: Client) -> None:
    env = client.get("/env")["env"]
    assert env["PATH"] and "SANDMAN_EXECD" not in env
    client.exec("export FROM_COMMAND='a b'")
    assert client.get("/env")["env"]["FROM_COMMAND"] == "a b"
    tricky = "line1\nline2 'quoted' \"double\" $HOME `tick` \\"
    changed = client.post(
        "/env", {"set": {"TRICKY": tricky, "EMPTY": ""}, "unset": ["FROM_COMMAND"]}
    )["env"]
    assert changed["TRICKY"] == tricky and changed["EMPTY"] == ""
    assert "FROM_COMMAND" not in changed
    assert client.exec('printf %s "$TRICKY"')["output"] == tricky
    assert client.exec("sh -c 'echo \"$EMPTY|$FROM_COMMAND|\"'")["output"] == "||\n"


@pytest.mark.parametrize(
    "body, code",
    [
        ({"set": {"1BAD": "x"}}, "bad_value"),
        ({"set": {"A-B": "x"}}, "bad_value"),
        ({"set": {"SANDMAN_EXECD": "x"}}, "bad_value"),
        ({"set": {"OK": 1}}, "bad_type"),
        ({"unset": "PATH"}, "bad_type"),
        ({"set": {"UID": "0"}}, "env_refused"),  # readonly in bash
    ],
)
def test_bad_env_changes_are_refused_and_the_shell_keeps_its_state(
    client: Client, body, code: str
) -> None:
    client.exec("export KEEP=1; cd /")
    status, answer = client.request("POST", "/env", body)
    assert status == 400 and answer["error"] == code, answer
    assert client.exec("echo $KEEP $PWD")["output"] == "1 /\n"


def _field_shape(reading) -> None:
    assert ("value" in reading and isinstance(reading["source"], str) and reading["source"]) or (
        set(reading) == {"unreadable"} and reading["unreadable"]
    )


def test_probe_reports_every_field_with_a_source(start_execd) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    target = "127.0.0.1:%d" % listener.getsockname()[1]
    d = start_execd("--probe-egress-target", target, "--default-timeout", "1800")
    c = d.client()
    c.post("/env", {"set": {"PYTHONHASHSEED": "0", "TZ": "Australia/Sydney"}})
    readings = c.get("/probe")["readings"]
    listener.close()
    assert set(readings) == {
        "egress",
        "cpu_quota",
        "visible_cpus",
        "memory_limit",
        "uid",
        "gid",
        "user",
        "time_zone",
        "hash_seed",
        "time_limit",
    }
    for reading in readings.values():
        _field_shape(reading)
    assert readings["egress"]["value"] == "open" and target in readings["egress"]["source"]
    assert readings["visible_cpus"]["value"] == len(os.sched_getaffinity(0))
    assert readings["uid"]["value"] == os.getuid() and readings["gid"]["value"] == os.getgid()
    assert readings["hash_seed"]["value"] == "0"
    assert readings["time_zone"]["value"] == "Australia/Sydney"
    assert readings["time_limit"]["value"] == 1800
    for field in ("cpu_quota", "memory_limit"):  # this machine has cgroup files to read
        assert "value" in readings[field] and "cgroup v" in readings[field]["source"]
    c.close()


def test_probe_says_denied_for_a_closed_port_and_unreadable_without_cgroups(
    start_execd, tmp_path
) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    empty = tmp_path / "no-cgroups"
    empty.mkdir()
    d = start_execd("--probe-egress-target", "127.0.0.1:%d" % port, "--cgroup-root", str(empty))
    readings = d.client().get("/probe")["readings"]
    assert readings["egress"]["value"] == "denied"
    assert "ECONNREFUSED" in readings["egress"]["source"]
    assert set(readings["cpu_quota"]) == {"unreadable"}
    assert set(readings["memory_limit"]) == {"unreadable"}
    assert str(empty) in readings["cpu_quota"]["unreadable"]
    assert readings["hash_seed"]["value"] is None  # unset is a reading, with its source
    assert "unset" in readings["hash_seed"]["source"]


def test_probe_reports_a_malformed_egress_target_as_unreadable(start_execd) -> None:
    d = start_execd("--probe-egress-target", "no-port-here")
    readings = d.client().get("/probe")["readings"]
    assert set(readings["egress"]) == {"unreadable"}
