"""The trainer client reads execd's answers through ``execd.protocol``: against a real execd
its results carry execd's values, and an answer of an undeclared shape (a tiny stdlib server)
is a ``SandmanClientError`` "bad_response", never a guessed default."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from execd.tests.helpers import REPO_ROOT, TOKEN
from sandboxes.client import Client, Sandbox, SandmanClientError

pytestmark = pytest.mark.timeout(120)


def sandbox_at(address: str) -> Sandbox:
    rest = Client("http://127.0.0.1:9", "unused")  # never called: no release in these tests
    return Sandbox(
        rest,
        sandbox_id=1,
        name="sb-1",
        address=address,
        token=TOKEN,
        source="created",
        wait_ms=0.0,
        queue_ms=0.0,
    )


@pytest.fixture
def execd_address(tmp_path: Path) -> Iterator[str]:
    (tmp_path / "ws").mkdir()
    (tmp_path / "token").write_text(TOKEN + "\n")
    argv = [sys.executable, "-m", "execd", "--port", "0", "--token-file", str(tmp_path / "token")]
    argv += ["--workspace", str(tmp_path / "ws"), "--run-dir", str(tmp_path / "run")]
    argv += ["--probe-egress-target", "127.0.0.1:9", "--probe-egress-timeout", "0.2"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=REPO_ROOT), cwd=tmp_path
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.startswith("listening on "), line
    yield f"127.0.0.1:{line.rsplit(':', 1)[1].strip()}"
    proc.terminate()
    assert proc.wait(30) == 0


def test_every_execd_call_of_the_trainer_client_reads_the_declared_shape(execd_address):
    sb = sandbox_at(execd_address)
    assert sb.health()["ok"] is True
    ran = sb.run("echo hi; (exit 4)")
    assert (ran.exit_code, ran.output, ran.ok, ran.error) == (4, "hi\n", False, None)
    assert sb.write("a.txt", "x\ny\n").sha256 == hashlib.sha256(b"x\ny\n").hexdigest()
    window = sb.read("a.txt", start_line=2)
    assert (window.content, window.size, window.raw["total_lines"]) == ("y\n", 4, 2)
    assert sb.read_bytes("a.txt").data == b"x\ny\n"
    assert sb.set_env({"SHAPE": "1"})["env"]["SHAPE"] == "1"
    assert sb.env()["SHAPE"] == "1"
    assert set(sb.reset()) >= {"killed", "survivors", "shell_alive", "duration_ms"}
    assert sb.probe()["readings"]["uid"]["value"] == os.getuid()
    with pytest.raises(SandmanClientError) as refused:
        sb.read("a.txt", start_line=0)
    assert (refused.value.status, refused.value.code) == (400, "bad_value")
    sb._conn.close()  # type: ignore[union-attr]


def test_run_passes_isolate_cwd_and_output_cap_and_reads_the_failure_fields(execd_address):
    """Issue 14 item 2 through the trainer client: isolated calls leave no state, a cwd
    lasts one call, and a timeout is ``timed_out`` with ``error_code`` "timeout"."""
    sb = sandbox_at(execd_address)
    isolated = sb.run("cd /; export GONE=1; exit 5", isolate=True)
    assert (isolated.exit_code, isolated.shell_restarted, isolated.error_code) == (5, False, None)
    assert sb.run("pwd", cwd="/tmp").output == "/tmp\n"
    assert sb.run("pwd; echo ${GONE:-unset}").output.endswith("/ws\nunset\n")
    capped = sb.run("head -c 1000 /dev/zero", max_output_bytes=10)
    assert capped.truncated and capped.output_bytes == 1000
    late = sb.run("sleep 5", timeout_s=0.2)
    assert (late.exit_code, late.timed_out, late.error_code) == (124, True, "timeout")
    refused = sb.run("echo 'open")
    assert refused.error_code == "syntax_error" and "unexpected EOF" in refused.output
    sb.write("r.bin", b"0123456789")
    part = sb.read_bytes("r.bin", offset=2, length=3)
    assert (part.data, part.size, part.offset, part.complete) == (b"234", 10, 2, False)
    assert part.sha256 == hashlib.sha256(b"0123456789").hexdigest()
    sb._conn.close()  # type: ignore[union-attr]


class _Wrong(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    ANSWERS: dict[str, tuple[int, Any]] = {
        "/exec": (200, {"exit_code": 0, "output": "hi\n"}),  # the rest missing
        "/files/read": (200, {"text": "hi", "size": 2, "sha256": ""}),  # an old field name
        "/files/read_bytes": (200, {"path": "/a", "content_b64": "%%", "size": 1, "sha256": ""}),
        "/env": (200, {"PATH": "/bin"}),  # the environment without its "env" key
        "/health": (200, ["ok"]),
        "/files/write": (502, b"<html>bad gateway</html>"),
        "/reset": (409, {"code": "busy"}),
    }

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
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
def wrong_address() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Wrong)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.mark.parametrize(
    "call, status, mentions",
    [
        (lambda sb: sb.run("true"), 200, "output_bytes"),
        (lambda sb: sb.read("a"), 200, "path"),
        (lambda sb: sb.read_bytes("a"), 200, "base64"),
        (lambda sb: sb.env(), 200, "env"),
        (lambda sb: sb.health(), 200, "not a JSON object"),
        (lambda sb: sb.write("a", "x"), 502, "not a JSON object"),
        (lambda sb: sb.reset(), 409, "error"),
    ],
)
def test_an_execd_answer_of_an_undeclared_shape_is_a_bad_response(
    wrong_address: str, call: Any, status: int, mentions: str
) -> None:
    sb = sandbox_at(wrong_address)
    with pytest.raises(SandmanClientError) as bad:
        call(sb)
    assert (bad.value.status, bad.value.code) == (status, "bad_response")
    assert mentions in bad.value.detail
