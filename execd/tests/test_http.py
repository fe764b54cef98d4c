"""The HTTP contract: token on every route but /health, JSON errors for bad
input with the shell's state untouched, keep-alive, 409 while busy."""

import hashlib
import hmac
import os
import socket
import subprocess
import sys
import threading
from typing import Any, Callable

import pytest

from execd.server import ROUTES
from execd.tests.helpers import REPO_ROOT, TOKEN, Client, Execd
from execd.tokens import derive_token

pytestmark = pytest.mark.timeout(60)

GUARDED = sorted(key for key, route in ROUTES.items() if route.auth)


def test_health_needs_no_token(execd: Execd) -> None:
    c = execd.client(token=None)
    status, body = c.request("GET", "/health")
    assert status == 200 and body == {"ok": True, "version": body["version"], "shell_alive": True}


@pytest.mark.parametrize("token", ["wrong-token", TOKEN + "x", TOKEN[:-1]])
def test_health_with_a_token_checks_it_so_a_caller_knows_its_own_sandbox(
    execd: Execd, token: str
) -> None:
    """A reused address (a dead sandbox's port or pod IP, now another's) must not look
    healthy to the holder of the first sandbox's token."""
    status, body = execd.client(token=token).request("GET", "/health")
    assert status == 401 and body["error"] == "unauthorized"
    status, body = execd.client(token=TOKEN).request("GET", "/health")
    assert status == 200 and body["ok"] is True


@pytest.mark.parametrize("token", [None, "wrong-token", TOKEN + "x", "", TOKEN[:-1]])
def test_every_other_route_answers_401_without_the_right_token(
    execd: Execd, tmp_path, token
) -> None:
    marker = tmp_path / "ran"
    c = execd.client(token=token)
    for method, path in GUARDED + [("GET", "/no/such/route"), ("POST", "/health")]:
        body = {"command": "touch %s" % marker} if path == "/exec" else {}
        status, answer = c.request(method, path, body if method == "POST" else None)
        assert status == 401, (method, path, answer)
        assert answer["error"] == "unauthorized" and answer["detail"]
    assert not marker.exists()
    status, _ = c.request(
        "POST", "/exec", {"command": "true"}, headers={"Authorization": "Basic " + TOKEN}
    )
    assert status == 401


def test_the_token_is_not_visible_to_commands(execd: Execd, client: Client) -> None:
    out = client.exec("env; cat /proc/$$/environ | tr '\\0' '\\n'; cat /proc/$$/cmdline")["output"]
    assert TOKEN not in out
    assert "token" not in out.lower().replace("token_", "")  # nor the token file's path
    assert client.exec("env | grep -c SANDMAN_")["output"] == "0\n"  # no marker of execd's


@pytest.mark.parametrize(
    "raw, code",
    [
        (b"{not json", "bad_json"),
        (b"\xff\xfe", "bad_json"),
        (b"[1, 2]", "bad_request"),
        (b'"command"', "bad_request"),
        (b"{}", "missing_field"),
        (b'{"command": 5}', "bad_type"),
        (b'{"command": "true", "timeout_s": "10"}', "bad_type"),
        (b'{"command": "true", "timeout_s": true}', "bad_type"),
        (b'{"command": "true", "timeout_s": -1}', "bad_value"),
        (b'{"command": "true", "cwd": "/no/such/dir"}', "bad_cwd"),
        (b'{"command": "true", "cwd": 3}', "bad_type"),
        (b'{"command": "true", "extra": 1}', "unknown_field"),
        (b'{"command": "a\\u0000b"}', "bad_value"),
    ],
)
def test_malformed_exec_requests_get_400_and_the_shell_keeps_its_state(
    client: Client, raw: bytes, code: str
) -> None:
    client.exec("cd / && export KEEP=me")
    status, body = client.request("POST", "/exec", raw=raw)
    assert status == 400 and body["error"] == code and body["detail"], body
    assert client.exec("echo $PWD $KEEP")["output"] == "/ me\n"


def test_unknown_routes_and_methods(client: Client) -> None:
    assert client.request("GET", "/nope")[0] == 404
    status, body = client.request("GET", "/exec")
    assert status == 405 and body["error"] == "method_not_allowed"
    status, body = client.request("POST", "/exec", raw=b"x" * 10, headers={"Content-Length": "-5"})
    assert status in (400, 413)


def test_requests_share_one_keep_alive_connection(client: Client) -> None:
    client.exec("true")
    sock = client.conn.sock
    local = sock.getsockname()
    for _ in range(20):
        client.exec("true")
        client.request("GET", "/health")
        client.request("POST", "/files/read", {"path": "/nonexistent"})
    assert client.conn.sock is sock and sock.getsockname() == local


def _gate(tmp_path):
    started, release = str(tmp_path / "started"), str(tmp_path / "release")
    os.mkfifo(started)
    os.mkfifo(release)
    return started, release


def test_a_second_command_while_one_runs_gets_409_busy(execd: Execd, tmp_path) -> None:
    started, release = _gate(tmp_path)
    first, second = execd.client(), execd.client()
    result = {}

    def run_first() -> None:
        result["first"] = first.exec(
            "echo up > %s; read word < %s; echo got $word" % (started, release)
        )

    t = threading.Thread(target=run_first)
    t.start()
    with open(started) as f:  # blocks until the first command is running
        assert f.read() == "up\n"
    status, body = second.request("POST", "/exec", {"command": "echo second"})
    assert status == 409 and body["error"] == "busy"
    assert second.request("GET", "/env")[0] == 409
    assert second.request("GET", "/health")[1]["shell_alive"] is True
    with open(release, "w") as f:
        f.write("go\n")
    t.join(30)
    assert result["first"]["output"] == "got go\n" and result["first"]["exit_code"] == 0
    assert second.exec("echo second")["output"] == "second\n"
    first.close()
    second.close()


def test_reset_interrupts_a_running_command(execd: Execd, tmp_path) -> None:
    started, _release = _gate(tmp_path)
    runner, admin = execd.client(), execd.client()
    result = {}
    t = threading.Thread(
        target=lambda: result.setdefault("r", runner.exec("echo up > %s; sleep 300" % started))
    )
    t.start()
    with open(started) as f:
        f.read()
    report = admin.post("/reset")
    t.join(30)
    assert "interrupted by /reset" in result["r"]["error"]
    assert report["shell_alive"] is True and report["survivors"] == []
    assert admin.exec("echo fresh")["output"] == "fresh\n"
    runner.close()
    admin.close()


def _raw(execd: Execd, data: bytes) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", execd.port), timeout=30) as s:
        s.sendall(data)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


@pytest.mark.parametrize(
    "request_bytes, status",
    [
        (b"GARBAGE\r\n\r\n", b"400"),
        (b"GET /health HTTP/2.0\r\n\r\n", b"400"),
        (b"GET /health HTTP/1.1\r\nno colon here\r\n\r\n", b"400"),
        (b"GET /health HTTP/1.1\r\n" + b"X-A: b\r\n" * 101 + b"\r\n", b"431"),
        (b"GET /health HTTP/1.1\r\nX-Long: " + b"a" * 70000 + b"\r\n\r\n", b"431"),
    ],
)
def test_malformed_http_gets_a_json_error_and_the_connection_closes(
    execd: Execd, request_bytes: bytes, status: bytes
) -> None:
    answer = _raw(execd, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split()[1] == status, answer[:200]
    assert b"Connection: close" in head and b'"error"' in body


def test_http_10_closes_after_the_answer_and_expect_100_is_honoured(execd: Execd) -> None:
    answer = _raw(execd, b"GET /health HTTP/1.0\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and b'"ok": true' in answer
    body = b'{"command": "echo continued"}'
    answer = _raw(
        execd,
        b"POST /exec HTTP/1.1\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nExpect: 100-continue\r\nConnection: close\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body,
    )
    assert answer.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK")
    assert b"continued" in answer


def test_unlink_token_file_removes_the_file_commands_could_otherwise_read(
    start_execd: Callable[..., Execd],
) -> None:
    """With --unlink-token-file (the Kubernetes boot command) the 0600 token file is gone
    once execd listens, so a command running as execd's own user cannot read it."""
    d = start_execd("--unlink-token-file")
    token_file = os.path.join(os.path.dirname(d.run_dir), "token")
    assert not os.path.exists(token_file)
    c = Client(d.port)
    try:
        assert c.exec("echo ok")["output"] == "ok\n"
        assert TOKEN not in c.exec("cat %s 2>&1; true" % token_file)["output"]
    finally:
        c.close()


def test_a_token_derived_from_a_key_file_and_a_name_and_the_key_file_removed(
    start_execd: Callable[..., Execd], tmp_path: Any
) -> None:
    """--token-key-file KEY --token-name NAME (a Kubernetes pod's boot): the token is
    HMAC-SHA256(key, NAME) in hex; a token for another name, or the key itself, is refused;
    with --unlink-token-file the key file is gone once execd listens, so commands of
    execd's own user cannot read it, and the key is in no command's environment."""
    key_file = tmp_path / "key"
    key_file.write_bytes(b"the-job-key-0123\n")
    d = start_execd(
        token_args=[
            "--token-key-file",
            str(key_file),
            "--token-name",
            "sb-1",
            "--unlink-token-file",
        ]
    )
    assert not key_file.exists()
    token = derive_token(b"the-job-key-0123", "sb-1")
    assert token == hmac.new(b"the-job-key-0123", b"sb-1", hashlib.sha256).hexdigest()
    c = d.client(token=token)
    try:
        out = c.exec("cat %s 2>&1; env; true" % key_file)["output"]
        assert "the-job-key-0123" not in out and token not in out
        for wrong in (derive_token(b"the-job-key-0123", "sb-2"), "the-job-key-0123", TOKEN):
            status, _ = c.request("POST", "/exec", {"command": "true"}, token=wrong)
            assert status == 401
    finally:
        c.close()


def test_exactly_one_token_source_is_accepted(tmp_path: Any) -> None:
    """Both sources, neither, or a key without a name: execd refuses to start."""
    key_file = tmp_path / "key"
    key_file.write_text("k")
    ws = str(tmp_path)
    for args in (
        [],
        ["--token-file", str(key_file), "--token-key-file", str(key_file), "--token-name", "x"],
        ["--token-key-file", str(key_file)],
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "execd", "--port", "0", "--workspace", ws, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PYTHONPATH": REPO_ROOT},
        )
        assert proc.returncode == 2 and "token" in proc.stderr, (args, proc.stderr)


def test_execd_accepts_on_an_inherited_socket_and_no_command_gets_it(
    start_execd: Callable[..., Execd],
) -> None:
    """``--listen-fd`` (a local sandbox in an empty network namespace: the socket is bound in
    the host's): execd accepts on the socket it was given, says its address, and makes it
    close-on-exec, so a command finds no descriptor of it (a command holding the listening
    socket could accept calls meant for execd, with their token)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    port, fd = listener.getsockname()[1], listener.fileno()
    try:
        d = start_execd(listener=listener)
    finally:
        listener.close()  # execd's copy is the only one left
    assert d.port == port
    c = d.client()
    try:
        assert c.get("/health")["ok"] is True
        inode = os.stat("/proc/%d/fd/%d" % (d.proc.pid, fd)).st_ino  # pass_fds keeps the number
        # The shell's own descriptors, and a command's (ls's, inherited from the shell).
        found = c.exec(
            "for f in /proc/$$/fd/* /proc/self/fd/*; do stat -L -c %i $f 2>/dev/null; done"
        )
        assert str(inode) not in found["output"].split(), found
    finally:
        c.close()


def test_exactly_one_of_port_and_listen_fd_is_accepted(tmp_path: Any) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    for args in ([], ["--port", "0", "--listen-fd", "3"]):
        proc = subprocess.run(
            [sys.executable, "-m", "execd", "--token-file", str(token), "--workspace",
             str(tmp_path), *args],
            capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": REPO_ROOT},
        )  # fmt: skip
        assert proc.returncode == 2 and "--listen-fd" in proc.stderr, (args, proc.stderr)
