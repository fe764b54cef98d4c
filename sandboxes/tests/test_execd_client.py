"""The async execd client against a REAL execd over HTTP (``python3 -m execd --port 0``, as
execd's own tests start it), every method; and against a tiny stdlib HTTP server that answers
shapes the protocol does not declare, which must raise instead of being guessed at."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from execd.protocol import StateRequest
from execd.tests.helpers import TOKEN, Execd
from sandboxes.execd_client import (
    ExecdBadAnswer,
    ExecdClient,
    ExecdRefused,
    ExecdUnavailable,
    new_session,
)
from sandboxes.tests.execd_support import running_execd

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(120)]


@pytest.fixture
def execd(tmp_path: Path) -> Iterator[Execd]:
    with running_execd(tmp_path) as daemon:
        yield daemon


def address(daemon: Execd) -> str:
    return f"127.0.0.1:{daemon.port}"


async def test_health_and_exec_keep_the_shell_between_calls(execd: Execd) -> None:
    async with ExecdClient(address(execd), TOKEN) as client:
        health = await client.health()
        assert health.ok is True and health.shell_alive is True and health.version
        await client.exec("export GREETING=hello && mkdir -p sub && cd sub")
        ran = await client.exec('echo "$GREETING from $(basename "$PWD")"')
        assert (ran.exit_code, ran.output, ran.error) == (0, "hello from sub\n", None)
        assert (await client.exec("exit 3")).exit_code == 3
        assert (await client.exec("pwd", cwd="/")).output == "/\n"
        slow = await client.exec("sleep 30", timeout_s=0.5)
        assert slow.exit_code == 124
        assert TOKEN not in repr(client)


async def test_files_read_read_bytes_and_write_round_trip_exactly(execd: Execd) -> None:
    async with ExecdClient(address(execd), TOKEN) as client:
        text = "one\r\ntwo\nthree"
        wrote = await client.write("d/a.txt", text, make_parents=True, mode="0600")
        assert wrote.sha256 == hashlib.sha256(text.encode()).hexdigest()
        assert wrote.path == os.path.join(execd.workspace, "d", "a.txt")
        assert os.stat(wrote.path).st_mode & 0o777 == 0o600
        read = await client.read("d/a.txt")
        assert (read.content, read.size, read.sha256) == (text, len(text), wrote.sha256)
        assert read.line_endings == "mixed" and read.complete
        window = await client.read("d/a.txt", start_line=2, max_lines=1)
        assert (window.content, window.complete, window.total_lines) == ("two\n", False, 3)

        blob = bytes(range(256)) + b"\xff\xfe\r\n"
        wrote_blob = await client.write("blob.bin", blob)
        got = await client.read_bytes("blob.bin")
        assert got.data() == blob and got.sha256 == wrote_blob.sha256 and got.size == len(blob)

        with pytest.raises(ExecdRefused) as stale:
            await client.write("d/a.txt", "clobber", expected_sha256="0" * 64)
        assert (stale.value.status, stale.value.code) == (409, "sha_mismatch")
        assert stale.value.extra == {"current_sha256": wrote.sha256}
        assert (await client.read("d/a.txt")).content == text
        with pytest.raises(ExecdRefused) as binary:
            await client.read("blob.bin")
        assert (binary.value.status, binary.value.code) == (422, "not_utf8")


async def test_env_get_set_and_unset_act_on_the_persistent_shell(execd: Execd) -> None:
    async with ExecdClient(address(execd), TOKEN) as client:
        after = await client.set_env({"PROTO_A": "1 2", "PROTO_B": "x"})
        assert after["PROTO_A"] == "1 2" and after["PROTO_B"] == "x"
        after = await client.set_env(unset=["PROTO_B"])
        assert "PROTO_B" not in after
        assert (await client.env())["PROTO_A"] == "1 2"
        assert (await client.exec('echo "$PROTO_A"')).output == "1 2\n"
        with pytest.raises(ExecdRefused) as refused:
            await client.set_env({"SANDMAN_EXECD_X": "1"})
        assert (refused.value.status, refused.value.code) == (400, "bad_value")


async def test_reset_kills_what_the_sandbox_started_and_restarts_the_shell(execd: Execd) -> None:
    async with ExecdClient(address(execd), TOKEN) as client:
        started = await client.exec("sleep 300 > /dev/null 2>&1 & echo $!")
        pid = int(started.output)
        report = await client.reset()
        assert pid in report.killed and report.survivors == [] and report.shell_alive
        assert (await client.exec("echo after")).output == "after\n"


async def test_state_baseline_check_and_restore(execd: Execd) -> None:
    async with ExecdClient(address(execd), TOKEN) as client:
        await client.write("kept.txt", "original")
        base = await client.state_baseline(StateRequest(roots=[execd.workspace]))
        assert base.roots == [execd.workspace] and base.files >= 1
        assert (await client.state_check()).clean is True
        await client.write("kept.txt", "changed")
        await client.write("added.txt", "new")
        check = await client.state_check()
        assert not check.clean
        assert {(d["change"], os.path.basename(d["path"])) for d in check.differences} == {
            ("modified", "kept.txt"),
            ("added", "added.txt"),
        }
        restored = await client.state_restore()
        assert restored.clean and restored.unrestorable == [] and len(restored.restored) == 2
        assert (await client.read("kept.txt")).content == "original"


async def test_probe_reads_run_conditions(execd: Execd) -> None:
    async with ExecdClient(address(execd), TOKEN) as client:
        readings = (await client.probe()).readings
        assert readings["uid"] == {"value": os.getuid(), "source": "getuid()"}
        assert readings["egress"]["value"] == "denied"


async def test_a_wrong_token_is_refused_but_health_needs_none(execd: Execd) -> None:
    async with ExecdClient(address(execd), "") as anonymous:
        assert (await anonymous.health()).ok
        with pytest.raises(ExecdRefused) as refused:
            await anonymous.exec("true")
        assert (refused.value.status, refused.value.code) == (401, "unauthorized")
    async with ExecdClient(address(execd), "wrong-token") as wrong:
        with pytest.raises(ExecdRefused, match="401 unauthorized"):
            await wrong.probe()


async def test_clients_share_one_session_and_its_kept_connection(execd: Execd) -> None:
    session = new_session()
    try:
        for _ in range(3):
            client = ExecdClient(address(execd), TOKEN, session=session)
            assert (await client.exec("echo shared")).output == "shared\n"
            await client.close()  # a shared session stays open
        assert not session.closed
        assert (await ExecdClient(address(execd), "", session=session).health()).ok
    finally:
        await session.close()


async def test_a_dead_address_raises_one_transport_error_naming_the_address() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with ExecdClient(f"127.0.0.1:{port}", TOKEN, timeout_s=5) as client:
        for call in (client.health(), client.exec("true"), client.state_check()):
            with pytest.raises(ExecdUnavailable) as failed:
                await call
            assert failed.value.address == f"127.0.0.1:{port}"
            assert f"127.0.0.1:{port}" in str(failed.value) and TOKEN not in str(failed.value)


async def test_a_silent_server_times_out_as_a_transport_error() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # accepts (the kernel's backlog) but never answers
        port = listener.getsockname()[1]
        async with ExecdClient(f"127.0.0.1:{port}", TOKEN, timeout_s=0.3) as client:
            with pytest.raises(ExecdUnavailable, match="Timeout"):
                await client.health()


async def test_an_address_without_a_port_is_refused_at_once() -> None:
    with pytest.raises(ValueError, match="host:port"):
        ExecdClient("10.0.0.7", TOKEN)


# --- answers of undeclared shapes -----------------------------------------------------------


class _Wrong(BaseHTTPRequestHandler):
    """Answers each path with the (status, body) in ``ANSWERS``; body bytes are sent as is."""

    protocol_version = "HTTP/1.1"
    ANSWERS: dict[str, tuple[int, Any]] = {
        "/health": (200, {"ok": True}),  # no version, no shell_alive
        "/exec": (
            200,
            {
                "exit_code": "0",
                "output": "",
                "output_bytes": 0,
                "truncated": False,
                "dropped_bytes": 0,
                "duration_ms": 1,
                "shell_restarted": False,
            },
        ),
        "/state/check": (200, {"ok": True}),  # an old shape the controller used to accept
        "/env": (200, {"PATH": "/bin"}),  # the env without its "env" key
        "/probe": (200, [1, 2]),
        "/reset": (500, b"<html>proxy error</html>"),
        "/files/read": (404, {"code": "missing", "message": "no"}),
        "/files/read_bytes": (200, {"path": "/a", "content_b64": "!!", "size": 2, "sha256": ""}),
    }

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        status, body = self.ANSWERS[self.path]
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: the test asserts on the client's errors


@pytest.fixture
def wrong_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Wrong)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize(
    "call, route, field",
    [
        (lambda c: c.health(), "GET /health", "version"),
        (lambda c: c.exec("true"), "POST /exec", "exit_code"),
        (lambda c: c.state_check(), "POST /state/check", "clean"),
        (lambda c: c.env(), "GET /env", "env"),
        (lambda c: c.probe(), "GET /probe", ""),
        (lambda c: c.reset(), "POST /reset", ""),
        (lambda c: c.read("a"), "POST /files/read", "error"),
    ],
)
async def test_an_answer_of_an_undeclared_shape_raises_naming_route_and_field(
    wrong_server: str, call: Any, route: str, field: str
) -> None:
    async with ExecdClient(wrong_server, TOKEN) as client:
        with pytest.raises(ExecdBadAnswer) as bad:
            await call(client)
    assert bad.value.field == field and bad.value.address == wrong_server
    assert route.split()[1] in str(bad.value) and wrong_server in str(bad.value)


async def test_read_bytes_that_are_not_base64_raise_instead_of_decoding_garbage(
    wrong_server: str,
) -> None:
    async with ExecdClient(wrong_server, TOKEN) as client:
        answer = await client.read_bytes("a")
    with pytest.raises(ValueError, match="not base64"):
        answer.data()


class _OneAnswerPerConnection(BaseHTTPRequestHandler):
    """Answers the first request of a connection (full health shape, kept alive), and drops
    the connection at the second without a word: the idle-close race, made deterministic."""

    protocol_version = "HTTP/1.1"
    connections = 0

    def setup(self) -> None:
        type(self).connections += 1
        self.answered = False
        super().setup()

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.answered:
            self.close_connection = True  # closes the socket without an answer
            return
        self.answered = True
        data = json.dumps({"ok": True, "version": "test", "shell_alive": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


async def test_a_get_is_retried_once_on_a_closed_kept_connection_but_a_post_never() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OneAnswerPerConnection)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    where = f"127.0.0.1:{server.server_address[1]}"
    try:
        async with ExecdClient(where, TOKEN) as client:
            for _ in range(3):
                assert (await client.health()).ok
            assert _OneAnswerPerConnection.connections == 3  # each GET after the first: retried
            with pytest.raises(ExecdUnavailable) as failed:
                await client.reset()  # a POST on the closed kept connection: not sent twice
            assert "POST /reset" in str(failed.value)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
