"""``POST /exec`` with ``stream: true`` (issue 14 item 4): output frames as the command
writes them, then exactly one final frame; the cap applies; the decoder is strict."""

import http.client
import json
import os
import time
from typing import Any, List, Tuple

import pytest

from execd import streaming
from execd.tests.helpers import TOKEN, Execd

pytestmark = pytest.mark.timeout(60)


def _open(execd: Execd, body: Any) -> Tuple[http.client.HTTPConnection, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", execd.port, timeout=30)
    headers = {"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"}
    conn.request("POST", "/exec", body=json.dumps(body).encode(), headers=headers)
    return conn, conn.getresponse()


def _events(resp: Any) -> List[streaming.Event]:
    def chunks() -> Any:
        while True:
            data = resp.read1(65536)
            if not data:
                return
            yield data

    return list(streaming.decode(chunks()))


def test_a_streamed_command_sends_its_output_then_one_final_frame(execd: Execd) -> None:
    conn, resp = _open(execd, {"command": "echo hi; echo there >&2; (exit 3)", "stream": True})
    assert resp.status == 200
    assert resp.getheader("Content-Type") == streaming.CONTENT_TYPE
    assert resp.getheader("Transfer-Encoding") == "chunked"
    events = _events(resp)
    assert [e.kind for e in events[:-1]] == ["o"] * (len(events) - 1)
    assert b"".join(e.data for e in events[:-1]) == b"hi\nthere\n"
    final = events[-1].json()
    assert events[-1].kind == "x"
    assert final["exit_code"] == 3 and final["output"] == "" and final["output_bytes"] == 9
    assert final["truncated"] is False and final["shell_restarted"] is False
    # the connection stays usable: a plain call on it answers normally
    conn.request(
        "POST",
        "/exec",
        body=b'{"command": "echo ok"}',
        headers={"Authorization": "Bearer " + TOKEN, "Content-Type": "application/json"},
    )
    again = conn.getresponse()
    assert json.loads(again.read())["output"] == "ok\n"
    conn.close()


def test_output_reaches_the_client_while_the_command_still_runs(execd: Execd) -> None:
    gate = os.path.join(execd.workspace, "gate")
    command = "printf first; while [ ! -e gate ]; do sleep 0.01; done; printf second"
    conn, resp = _open(execd, {"command": command, "stream": True, "timeout_s": 30})
    decoder = streaming.StreamDecoder()
    first = decoder.feed(resp.read1(65536))  # arrives before the gate exists
    assert [(e.kind, e.data) for e in first] == [("o", b"first")]
    assert not os.path.exists(gate)
    open(gate, "w").close()
    rest = []  # type: List[streaming.Event]
    deadline = time.monotonic() + 30
    while not decoder.finished and time.monotonic() < deadline:
        rest += decoder.feed(resp.read1(65536))
    assert b"".join(e.data for e in rest if e.kind == "o") == b"second"
    assert rest[-1].kind == "x" and rest[-1].json()["exit_code"] == 0
    conn.close()


def test_a_separate_stderr_is_streamed_in_its_own_frames_under_its_own_cap(
    execd: Execd,
) -> None:
    """``stderr: "separate"`` with ``stream: true``: stdout in ``o`` frames, stderr in ``s``
    frames (a kind only this combination sends), each capped on its own."""
    command = "echo out; echo err >&2; head -c 50 /dev/zero | tr '\\0' e >&2; echo out2"
    body = {"command": command, "stream": True, "stderr": "separate", "max_output_bytes": 20}
    conn, resp = _open(execd, body)
    events = _events(resp)
    assert {e.kind for e in events[:-1]} == {"o", "s"}
    assert b"".join(e.data for e in events if e.kind == "o") == b"out\nout2\n"
    assert b"".join(e.data for e in events if e.kind == "s") == b"err\n" + b"e" * 16
    final = events[-1].json()
    assert (final["stderr"], final["stderr_bytes"], final["output_bytes"]) == ("", 54, 9)
    assert final["truncated"] is False  # stdout's own cap was not reached
    conn.close()
    conn, resp = _open(execd, {"command": "echo err >&2", "stream": True})
    assert [(e.kind, e.data) for e in _events(resp)[:-1]] == [("o", b"err\n")]  # merged
    conn.close()


def test_the_output_cap_bounds_what_is_streamed(execd: Execd) -> None:
    body = {"command": "head -c 100 /dev/zero | tr '\\0' a", "stream": True, "max_output_bytes": 10}
    conn, resp = _open(execd, body)
    events = _events(resp)
    assert b"".join(e.data for e in events if e.kind == "o") == b"a" * 10
    final = events[-1].json()
    assert (final["output_bytes"], final["dropped_bytes"], final["truncated"]) == (100, 90, True)
    conn.close()


def test_a_syntax_error_is_refused_in_the_final_frame_with_bashs_diagnostic(execd: Execd) -> None:
    conn, resp = _open(execd, {"command": 'echo "open', "stream": True})
    events = _events(resp)
    assert [e.kind for e in events] == ["x"]
    final = events[0].json()
    assert final["error_code"] == "syntax_error" and final["exit_code"] == 2
    assert final["output"].startswith("bash: ")
    conn.close()


def test_a_refusal_before_the_command_starts_is_plain_json(execd: Execd) -> None:
    conn, resp = _open(execd, {"command": "true", "stream": True, "max_output_bytes": 1 << 40})
    assert resp.status == 400
    assert resp.getheader("Content-Type") == "application/json"
    assert json.loads(resp.read())["error"] == "bad_value"
    conn.close()


def test_a_client_that_hangs_up_mid_stream_leaves_the_shell_intact(execd: Execd) -> None:
    client = execd.client()
    client.exec("export KEEP=yes")
    command = "for i in $(seq 200); do head -c 65536 /dev/zero; done; echo done > after"
    conn, resp = _open(execd, {"command": command, "stream": True})
    resp.read1(1024)
    conn.close()  # the command runs on; its writes to the gone client are dropped
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        status, body = client.request("POST", "/exec", {"command": "cat after; echo $KEEP"})
        if status == 200 and body["output"] == "done\nyes\n":
            break
        assert status == 409 and body["error"] == "busy", body
    else:
        raise AssertionError("the streamed command never finished")
    assert body["shell_restarted"] is False
    client.close()


@pytest.mark.parametrize(
    "wire, problem",
    [
        (b"o 3\nabcz 2\n{}", "malformed frame header"),
        (b"o 03\nabc", "malformed frame header"),
        (b"q 1\na", "malformed frame header"),
        (b"x 2\n{}o 1\na", "bytes after the final frame"),
        (b"o 99999999999\n", "malformed frame header"),
    ],
)
def test_the_decoder_refuses_anything_but_frames_ending_in_one_final(
    wire: bytes, problem: str
) -> None:
    decoder = streaming.StreamDecoder()
    with pytest.raises(streaming.StreamError, match=problem):
        for i in range(len(wire)):  # byte by byte: framing never depends on read sizes
            decoder.feed(wire[i : i + 1])
        decoder.close()


def test_the_decoder_reads_stderr_frames_as_output_that_does_not_end_the_stream() -> None:
    wire = b"o 2\nhis 3\nerro 1\n!x 2\n{}"
    decoder = streaming.StreamDecoder()
    events = []  # type: List[streaming.Event]
    for i in range(len(wire)):
        events += decoder.feed(wire[i : i + 1])
    decoder.close()
    kinds = [(e.kind, e.data) for e in events]
    assert kinds == [("o", b"hi"), ("s", b"err"), ("o", b"!"), ("x", b"{}")]


def test_a_stream_cut_before_its_final_frame_is_an_error() -> None:
    decoder = streaming.StreamDecoder()
    assert decoder.feed(b"o 2\nhi") == [streaming.Event("o", b"hi")]
    with pytest.raises(streaming.StreamError, match="without its final frame"):
        decoder.close()


def test_a_streamed_command_that_times_out_ends_with_a_timed_out_final_frame(
    execd: Execd,
) -> None:
    command = "printf partial; sleep 30"
    body = {"command": command, "stream": True, "timeout_s": 0.5}
    plain = execd.client().exec(command, timeout_s=0.5)
    conn, resp = _open(execd, body)
    events = _events(resp)
    streamed = b"".join(e.data for e in events if e.kind == "o")
    assert streamed.startswith(b"partial")
    assert streamed.decode() == plain["output"]  # what a plain call answers, bash's notice too
    final = events[-1].json()
    assert (final["exit_code"], final["timed_out"], final["error_code"]) == (124, True, "timeout")
    assert final["shell_restarted"] is False
    conn.close()


def _chunks(writes: List[bytes]) -> List[bytes]:
    """The HTTP chunks' payloads in ``writes`` (the head stripped)."""
    body = b"".join(writes).split(b"\r\n\r\n", 1)[1]
    out = []
    while True:
        size, _, body = body.partition(b"\r\n")
        if not int(size, 16):
            return out
        out.append(body[: int(size, 16)])
        body = body[int(size, 16) + 2 :]


def test_held_output_frames_leave_with_the_final_frame_in_one_write() -> None:
    """A short command's output and its final frame: one socket write, one HTTP chunk
    (one client wake-up instead of two; bench/execd_latency.py ``echo_hi_streamed``)."""
    writes = []  # type: List[bytes]
    now = [100.0]
    out = streaming.ChunkedAnswer(lambda parts: writes.append(b"".join(parts)), False)
    capture = streaming.StreamCapture(1 << 20, out, bytes, lambda: now[0])
    capture.feed(b"hi\n")
    assert writes == [] and capture.due == 100.0 + streaming.HOLD_S
    out.finish(streaming.final_frame({"exit_code": 0}))
    assert len(writes) == 1 and writes[0].endswith(b"\r\n0\r\n\r\n")
    assert _chunks(writes) == [b'o 3\nhi\nx 16\n{"exit_code": 0}']


def test_held_output_frames_go_out_once_due_or_once_large() -> None:
    writes = []  # type: List[bytes]
    now = [100.0]
    out = streaming.ChunkedAnswer(lambda parts: writes.append(b"".join(parts)), False)
    capture = streaming.StreamCapture(1 << 20, out, bytes, lambda: now[0])
    capture.feed(b"a")
    capture.feed(b"b")  # held with the first: still due at the first one's time
    assert writes == [] and capture.due == 100.0 + streaming.HOLD_S
    now[0] = capture.due
    capture.flush()  # what Shell does once the select timed out at ``due``
    assert _chunks(writes + [b"0\r\n\r\n"]) == [b"o 1\nao 1\nb"] and capture.due is None
    capture.feed(b"z" * streaming.HOLD_BYTES)  # a big read is written at once
    assert len(writes) == 2 and capture.due is None
    assert _chunks(writes + [b"0\r\n\r\n"])[1] == b"o %d\n" % streaming.HOLD_BYTES + b"z" * (
        streaming.HOLD_BYTES
    )
