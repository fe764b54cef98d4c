"""The trainer client against a real execd through a real TCP proxy (issue 14 items 4, 5):
a command whose connection is cut after it started is resent with the same
``Idempotency-Key`` and runs once; ``Sandbox.stream`` iterates over a command's output."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from execd.tests.helpers import REPO_ROOT, TOKEN
from sandboxes.client import Client, RunResult, Sandbox, SandmanClientError

pytestmark = pytest.mark.timeout(120)


def sandbox_at(address: str) -> Sandbox:
    rest = Client("http://127.0.0.1:9", "unused")  # never called: these tests release nothing
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


class CutProxy:
    """Relays TCP between clients and execd; ``cut()`` closes every open pair, as a
    broken network would. ``upstream_bytes[i]`` counts what connection i forwarded."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.pairs: list[tuple[socket.socket, socket.socket]] = []
        self.upstream_bytes: list[int] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            with self.lock:
                index = len(self.upstream_bytes)
                self.pairs.append((conn, up))
                self.upstream_bytes.append(0)
            threading.Thread(target=self._pump, args=(conn, up, index), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, conn, None), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, index: int | None) -> None:
        while True:
            try:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
            except OSError:
                break
            if index is not None:
                with self.lock:
                    self.upstream_bytes[index] += len(data)
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        with self.lock:
            pairs, self.pairs = self.pairs, []
        for pair in pairs:
            for sock in pair:
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()


@pytest.fixture
def execd_at(tmp_path: Path) -> Iterator[tuple[tuple[str, int], Path]]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "token").write_text(TOKEN + "\n")
    argv = [sys.executable, "-m", "execd", "--port", "0", "--token-file", str(tmp_path / "token")]
    argv += ["--workspace", str(ws), "--run-dir", str(tmp_path / "run")]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=REPO_ROOT), cwd=tmp_path
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    assert line.startswith("listening on "), line
    yield ("127.0.0.1", int(line.rsplit(":", 1)[1])), ws
    proc.terminate()
    assert proc.wait(30) == 0


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)


def test_a_command_cut_off_after_it_started_is_resent_and_runs_once(execd_at: Any) -> None:
    address, ws = execd_at
    proxy = CutProxy(address)
    sb = sandbox_at(f"127.0.0.1:{proxy.port}")
    results: list[RunResult | Exception] = []
    command = "echo ran >> counter; while [ ! -e gate ]; do sleep 0.01; done; echo finished"

    def call() -> None:
        try:
            results.append(sb.run(command, timeout_s=60))
        except Exception as exc:  # surfaced by the assertion below
            results.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    try:
        _until((ws / "counter").exists, "the command started")
        proxy.cut()  # the client's socket breaks while execd runs the command
        first = proxy.upstream_bytes[0]
        # the client resends: a second connection carries the same request (same key)
        _until(
            lambda: len(proxy.upstream_bytes) > 1 and proxy.upstream_bytes[1] >= first,
            "the resend reached execd",
        )
        (ws / "gate").touch()
        worker.join(60)
    finally:
        proxy.close()
    assert len(results) == 1 and isinstance(results[0], RunResult), results
    assert (results[0].exit_code, results[0].output) == (0, "finished\n")
    assert (ws / "counter").read_text() == "ran\n"  # ran once, not twice


def test_without_a_cut_each_call_gets_its_own_key_and_runs(execd_at: Any) -> None:
    address, ws = execd_at
    sb = sandbox_at(f"{address[0]}:{address[1]}")
    assert sb.run("echo ran >> counter").ok
    assert sb.run("echo ran >> counter; wc -l < counter").output == "2\n"


def test_the_client_iterates_over_a_streamed_commands_output(execd_at: Any) -> None:
    address, ws = execd_at
    sb = sandbox_at(f"{address[0]}:{address[1]}")
    stream = sb.stream("for i in 1 2 3; do echo line $i; done; (exit 4)")
    chunks = list(stream)
    assert b"".join(chunks) == b"line 1\nline 2\nline 3\n"
    assert stream.result is not None
    assert (stream.result.exit_code, stream.result.output_bytes) == (4, 21)
    assert sb.run("echo after").output == "after\n"  # the connection is reusable
    with pytest.raises(SandmanClientError) as refused:
        sb.stream("true", max_output_bytes=1 << 40)
    assert (refused.value.status, refused.value.code) == (400, "bad_value")


def test_a_stream_cut_short_raises_instead_of_guessing_a_status(execd_at: Any) -> None:
    address, ws = execd_at
    proxy = CutProxy(address)
    sb = sandbox_at(f"127.0.0.1:{proxy.port}")
    try:
        stream = sb.stream("echo first; while [ ! -e gate ]; do sleep 0.01; done", timeout_s=60)
        assert next(stream) == b"first\n"
        proxy.cut()
        with pytest.raises(SandmanClientError) as broken:
            list(stream)
        assert broken.value.code == "stream_broken"
        assert stream.result is None
    finally:
        (ws / "gate").touch()
        proxy.close()


def test_the_client_starts_polls_and_signals_a_background_command(execd_at: Any) -> None:
    address, ws = execd_at
    sb = sandbox_at(f"{address[0]}:{address[1]}")
    command = sb.start("echo up; while [ ! -e gate ]; do sleep 0.01; done; echo down")
    assert sb.run("echo free").output == "free\n"  # the shell is not held
    _until(lambda: command.poll().output == "up\n", "the first line")
    (ws / "gate").touch()
    done = command.wait(timeout_s=30)
    assert (done.exit_code, done.output, done.running) == (0, "up\ndown\n", False)
    assert command.poll(offset=3).output == "down\n"
    sleeper = sb.start("sleep 300")
    assert sleeper.signal("INT") == 2
    assert sleeper.wait(timeout_s=30).signal == 2
    with pytest.raises(SandmanClientError) as gone:
        sleeper.signal()
    assert (gone.value.status, gone.value.code) == (409, "not_running")
