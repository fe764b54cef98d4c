"""Exit-status frames (paper Table A25).

The status travels on its own fd as ``<marker> <kind> <status>\\n``; only a
terminated decimal 0-255 with this command's marker is accepted, anything
else is an error plus a shell restart. The forced cases use execd's test
hooks: ``expose_status_fd`` leaves fd 40 open inside the command so it can
write an empty, cut-off or foreign frame itself, and ``status_read_size``
makes execd read the status channel in chunks of that many bytes.
"""

import random

import pytest

from execd.frames import FrameError, FrameParser, OutputCapture
from execd.tests.helpers import Client

pytestmark = pytest.mark.timeout(120)

MARKER = "0123456789abcdef"
FORGE = "m=$__sm_m; "  # the command's own marker (a shell variable of the driver's)


# -- the parser on its own ---------------------------------------------------------


def test_parser_accepts_a_frame_split_over_any_reads() -> None:
    frame = ("%s x 127\n" % MARKER).encode()
    for size in (1, 2, 16, 17, 18, 19, len(frame)):
        p = FrameParser(MARKER)
        got = None
        for i in range(0, len(frame), size):
            got = p.feed(frame[i : i + size])
            if i + size < len(frame):
                assert got is None
        assert got is not None and (got.kind, got.status) == ("x", 127)


@pytest.mark.parametrize(
    "data",
    [
        b"%s x \n",  # empty status
        b"%s x 007\n",  # leading zeros
        b"%s x 256\n",  # out of range
        b"%s x -1\n",
        b"%s x 1 \n",  # not terminated right after the digits
        b"%s q 1\n",  # unknown kind
        b"fedcba9876543210 x 1\n",  # foreign marker
        b"%s x 1\n%s x 0\n",  # two frames
        b"\n",
    ],
)
def test_parser_rejects_anything_but_one_exact_frame(data: bytes) -> None:
    data = data.replace(b"%s", MARKER.encode())
    with pytest.raises(FrameError):
        FrameParser(MARKER).feed(data)


def test_parser_refuses_an_endless_frame() -> None:
    with pytest.raises(FrameError):
        FrameParser(MARKER).feed(MARKER.encode() + b" x " + b"1" * 80)


def test_output_capture_keeps_head_and_tail_within_the_cap() -> None:
    cap = OutputCapture(10)
    cap.feed(b"abcdefgh")
    cap.feed(memoryview(b"ijklmnopqrstuvwxyz"))
    assert cap.total == 26 and cap.dropped == 16
    assert bytes(cap.head) == b"abcde" and bytes(cap.tail) == b"vwxyz"
    assert "dropped 16 bytes" in cap.text()


# -- real bash, real HTTP ---------------------------------------------------------------


def test_empty_status_in_the_frame_is_an_error_and_a_restart(client: Client) -> None:
    """Table A25: empty status in the frame (real status 1), forced."""
    client.exec("export BEFORE=1")
    res = client.exec(
        FORGE + "builtin printf '%s x \\n' \"$m\" >&40; false",
        test_hooks={"expose_status_fd": True},
    )
    assert res["exit_code"] == -1 and res["shell_restarted"] is True
    assert "invalid status frame" in res["error"]
    assert client.exec("false")["exit_code"] == 1  # the next failing command is right too
    assert client.exec("echo ${BEFORE:-reset}")["output"] == "reset\n"


@pytest.mark.parametrize("read_size", [1, 17, 18])
def test_status_arriving_over_several_reads_is_assembled(client: Client, read_size: int) -> None:
    """Table A25: status arrives in a second read (real status 1), forced."""
    res = client.exec("false", test_hooks={"status_read_size": read_size})
    assert res["exit_code"] == 1 and "error" not in res and res["shell_restarted"] is False


def test_shell_dying_after_the_marker_reports_the_death_not_a_status(client: Client) -> None:
    """Table A25: shell dies after the marker, before the status (real status 1)."""
    res = client.exec(
        FORGE + "builtin printf '%s x ' \"$m\" >&40; kill -9 $$; false",
        test_hooks={"expose_status_fd": True},
    )
    assert res["exit_code"] == 137 and res["shell_restarted"] is True
    assert "incomplete status frame" in res["error"] and "signal 9" in res["error"]
    assert client.exec("true")["exit_code"] == 0


def test_shell_dying_mid_status_never_reports_the_partial_number(client: Client) -> None:
    """Table A25: shell dies after "12" of status 127 (the 19 Aug build said 12)."""
    res = client.exec(
        FORGE + "builtin printf '%s x 12' \"$m\" >&40; kill -9 $$; exit 127",
        test_hooks={"expose_status_fd": True},
    )
    assert res["exit_code"] == 137 and res["exit_code"] != 12
    assert "incomplete status frame" in res["error"]


def test_a_4096_byte_read_ending_right_after_the_marker(client: Client) -> None:
    """Table A25: 4,053 bytes of output, then a failing command; the status read
    ends right after the marker (real status 1)."""
    res = client.exec(
        "head -c 4053 /dev/zero | tr '\\0' x; false", test_hooks={"status_read_size": 17}
    )
    assert res["exit_code"] == 1 and res["output_bytes"] == 4053 and "error" not in res


def test_200_boundary_trials_all_report_the_true_status(client: Client) -> None:
    """Table A25: output lengths around 4,096 bytes and random exit codes, with
    status reads cut at the worst places; all 200 must be right."""
    rng = random.Random(20251027)
    wrong = []
    for trial in range(200):
        length = rng.randint(4096 - 64, 4096 + 64)
        code = rng.randint(0, 255)
        size = rng.choice([1, 16, 17, 18, 19, 4096])
        res = client.exec(
            "head -c %d /dev/zero | tr '\\0' y; (exit %d)" % (length, code),
            test_hooks={"status_read_size": size},
        )
        if (res["exit_code"], res["output_bytes"], res.get("error")) != (code, length, None):
            wrong.append((trial, length, code, size, res["exit_code"], res.get("error")))
    assert wrong == []


def test_user_redefinitions_cannot_hijack_the_frame(client: Client) -> None:
    """Table A25, forced: the formatting command redefined by the user's command."""
    res = client.exec(
        "shopt -s expand_aliases; alias printf='echo 0'; "
        "printf() { echo 0; }; echo() { :; }; source() { :; }; eval() { :; }; "
        "cd() { :; }; trap() { :; }; export() { :; }; set() { :; }; false"
    )
    assert res["exit_code"] == 1 and "error" not in res
    assert client.exec("false")["exit_code"] == 1
    assert client.exec("true")["exit_code"] == 0
    assert client.exec("(exit 42)")["exit_code"] == 42
    assert client.exec("pwd", cwd="/")["output"] == "/\n"


def test_shell_options_of_the_user_do_not_break_the_driver(client: Client) -> None:
    client.exec("set -u; set -o pipefail; set -C; shopt -s failglob nullglob; IFS=:")
    assert client.exec("false")["exit_code"] == 1
    assert client.exec("echo ok")["output"] == "ok\n"
    res = client.exec("set -x; echo traced")
    trace, out = res["output"].splitlines()
    assert trace.endswith("+ echo traced") and out == "traced"  # PS4 repeats per eval/source level
    assert client.exec("set +x; echo $-")["exit_code"] == 0


def test_set_e_failure_ends_the_shell_like_a_terminal_and_is_reported(client: Client) -> None:
    assert client.exec("set -e")["exit_code"] == 0
    res = client.exec("echo before; false; echo after")
    assert res["output"] == "before\n" and res["exit_code"] == 1
    assert res["shell_restarted"] is True and "exited with status 1" in res["error"]
    assert client.exec("false; echo set-e-gone")["output"] == "set-e-gone\n"
