"""Files an agent trips over (issue 14, item 6): a FIFO, socket or device is refused with
a clear 400 before any blocking ``open`` - the trial's read of a FIFO hung its request
thread forever - and a file past the size limit is read in ranges (``offset``/``length``)
with the whole file's size and SHA-256."""

import base64
import hashlib
import os
import socket

import pytest

from execd.tests.helpers import Client, Execd

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("route", ["/files/read", "/files/read_bytes", "/files/write"])
def test_a_fifo_is_refused_at_once_and_the_connection_keeps_serving(
    execd: Execd, client: Client, route: str
) -> None:
    os.mkfifo(os.path.join(execd.workspace, "pipe"))
    body = {"path": "pipe"} if route != "/files/write" else {"path": "pipe", "content": "x"}
    status, answer = client.request("POST", route, body)
    assert status == 400 and answer["error"] == "not_a_regular_file"
    assert "a FIFO" in answer["detail"]
    assert client.exec("echo alive")["output"] == "alive\n"  # no thread left in open()


def test_a_socket_and_a_device_are_refused(execd: Execd, client: Client) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(os.path.join(execd.workspace, "sock"))
        for path, kind in (("sock", "a socket"), ("/dev/null", "a character device")):
            status, answer = client.request("POST", "/files/read_bytes", {"path": path})
            assert (status, answer["error"]) == (400, "not_a_regular_file")
            assert kind in answer["detail"]
    finally:
        listener.close()


def test_a_file_past_the_limit_is_read_in_ranges_with_the_whole_files_digest(
    start_execd: "object",
) -> None:
    execd = start_execd("--max-file-bytes", "4096")  # type: ignore[operator]
    data = os.urandom(10000)
    with open(os.path.join(execd.workspace, "big.bin"), "wb") as f:
        f.write(data)
    client = execd.client()
    try:
        status, whole = client.request("POST", "/files/read_bytes", {"path": "big.bin"})
        assert status == 413 and whole["error"] == "too_large" and whole["limit"] == 4096
        got = b""
        while len(got) < len(data):
            part = client.post(
                "/files/read_bytes", {"path": "big.bin", "offset": len(got), "length": 4096}
            )
            assert part["size"] == 10000 and part["offset"] == len(got)
            assert part["sha256"] == hashlib.sha256(data).hexdigest()
            assert part["complete"] is False
            got += base64.b64decode(part["content_b64"])
        assert got == data
        tail = client.post("/files/read_bytes", {"path": "big.bin", "offset": 9990})
        assert base64.b64decode(tail["content_b64"]) == data[9990:]
        past = client.post("/files/read_bytes", {"path": "big.bin", "offset": 20000, "length": 5})
        assert past["content_b64"] == "" and past["size"] == 10000
        status, bad = client.request("POST", "/files/read_bytes", {"path": "big.bin", "offset": -1})
        assert (status, bad["error"]) == (400, "bad_value")
    finally:
        client.close()


def test_a_small_file_read_whole_is_complete(execd: Execd, client: Client) -> None:
    with open(os.path.join(execd.workspace, "a.txt"), "wb") as f:
        f.write(b"abc\n")
    whole = client.post("/files/read_bytes", {"path": "a.txt"})
    assert whole["complete"] is True and whole["offset"] == 0
    middle = client.post("/files/read_bytes", {"path": "a.txt", "offset": 1, "length": 2})
    assert base64.b64decode(middle["content_b64"]) == b"bc" and middle["complete"] is False
