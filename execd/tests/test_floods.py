"""Output floods and timeouts (paper Table A27): the answer carries at most the
cap (head and tail, with the dropped count), ``output_bytes`` counts all of it,
and execd's memory stays flat because the cap is applied while draining."""

import pytest

from execd.tests.helpers import Client, Execd

pytestmark = pytest.mark.timeout(120)

CAP = 100 * 1024
MiB = 1 << 20
RSS_LIMIT_KIB = 32 * 1024


def _kib(value: str) -> int:
    return int(value.split()[0])


@pytest.mark.parametrize("size_mib", [16, 64, 256, 1024])
def test_a_flood_is_capped_while_draining_and_memory_stays_flat(
    execd: Execd, client: Client, size_mib: int
) -> None:
    """Table A27: 16 MiB, 64 MiB, 256 MiB and 1,024 MiB of output."""
    size = size_mib * MiB
    res = client.exec("printf START; head -c %d /dev/zero; printf END" % size, timeout_s=100)
    assert res["exit_code"] == 0 and "error" not in res
    assert res["output_bytes"] == size + 8
    assert res["truncated"] is True and res["dropped_bytes"] == size + 8 - CAP
    assert res["output"].startswith("START\0") and res["output"].endswith("\0END")
    assert len(res["output"].encode()) < CAP + 200
    assert "dropped %d bytes" % (size + 8 - CAP) in res["output"]
    status = execd.status()
    assert _kib(status["VmHWM"]) < RSS_LIMIT_KIB, status["VmHWM"]
    assert _kib(status["VmRSS"]) < RSS_LIMIT_KIB


def test_an_endless_printer_is_killed_at_its_timeout_and_answered(
    execd: Execd, client: Client
) -> None:
    """Table A27: endless output; a normal timeout, with the output so far."""
    res = client.exec("yes", timeout_s=1)
    assert res["exit_code"] == 124 and "timed out" in res["error"]
    assert res["truncated"] is True and res["output_bytes"] > CAP
    assert res["output"].startswith("y\ny\n")
    assert _kib(execd.status()["VmHWM"]) < RSS_LIMIT_KIB
    assert client.exec("echo alive")["output"] == "alive\n"


def test_a_timeout_kills_the_group_returns_output_so_far_and_keeps_the_shell(
    client: Client, tmp_path
) -> None:
    """Item 6: exit 124, a clear error, the output produced so far; cwd and
    environment survive."""
    client.exec("cd %s && export SURVIVES=1" % tmp_path)
    res = client.exec("echo before; sleep 30 | cat; echo after", timeout_s=1)
    assert res["exit_code"] == 124
    assert res["output"].startswith("before\n") and "after" not in res["output"]
    assert "timed out after 1s" in res["error"] and res["shell_restarted"] is False
    assert res["duration_ms"] < 10000
    assert client.exec("echo $PWD $SURVIVES")["output"] == "%s 1\n" % tmp_path


def test_a_timeout_also_stops_a_loop_inside_the_shell_itself(client: Client) -> None:
    """A builtin loop has no child to kill: the shell is told to return."""
    client.exec("export STILL=here")
    res = client.exec("f() { while :; do :; done; }; f; echo not-reached", timeout_s=1)
    assert res["exit_code"] == 124 and "not-reached" not in res["output"]
    assert client.exec("echo $STILL")["output"] == "here\n"


def test_output_under_the_cap_is_returned_whole(client: Client) -> None:
    res = client.exec("head -c %d /dev/zero | tr '\\0' z" % (CAP - 1))
    assert res["output"] == "z" * (CAP - 1) and res["truncated"] is False
