"""The trainer client's sessions (issue 14, item 3) against a real execd: a named
session keeps its own shell state, an interrupt stops that session's running command
(another thread's ``run``) and nothing else, ``stderr="separate"`` returns the streams
apart, and a deleted session is gone."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from sandboxes.client import RunResult, SandmanClientError
from sandboxes.tests.test_client_execd_shapes import execd_address, sandbox_at

__all__ = ["execd_address"]  # the fixture, shared

pytestmark = pytest.mark.timeout(120)


def test_sessions_through_the_client(execd_address: str, tmp_path: Path) -> None:
    sb = sandbox_at(execd_address)
    build = sb.create_session("build", startup="export STAGE=built; cd /tmp")
    assert build.startup is not None and build.startup.exit_code == 0
    build.run("X=in-build")
    assert build.run("echo $X $STAGE; pwd").output == "in-build built\n/tmp\n"
    assert sb.run("echo ${X:-unset} ${STAGE:-unset}").output == "unset unset\n"
    assert [s["name"] for s in sb.sessions()] == ["default", "build"]

    split = sb.run("echo out; echo err >&2", stderr="separate")
    assert (split.output, split.stderr) == ("out\n", "err\n")
    assert sb.run("echo out; echo err >&2").stderr is None

    started = tmp_path / "started"
    answers: list[RunResult] = []
    worker = threading.Thread(
        target=lambda: answers.append(
            build.run(f"sh -c 'echo 1 > {started}; exec sleep 300'; echo after", timeout_s=60)
        )
    )
    worker.start()
    until = time.monotonic() + 20
    while not (started.exists() and started.stat().st_size):
        assert time.monotonic() < until, "the command never started"
        time.sleep(0.01)
    assert sb.run("echo default-free").output == "default-free\n"  # another session runs
    assert build.interrupt() is True
    worker.join(30)
    (stopped,) = answers
    assert (stopped.exit_code, stopped.error_code) == (130, "interrupted")
    assert "after" not in stopped.output
    assert build.run("echo $X").output == "in-build\n"  # the session's shell stayed
    assert build.interrupt() is False  # nothing runs now

    build.close()
    with pytest.raises(SandmanClientError) as gone:
        build.run("true")
    assert (gone.value.status, gone.value.code) == (404, "no_session")
    with pytest.raises(SandmanClientError) as dup:
        sb.create_session("default")
    assert (dup.value.status, dup.value.code) == (409, "session_exists")


def test_a_stream_runs_in_a_session_and_tells_stderr_apart(execd_address: str) -> None:
    sb = sandbox_at(execd_address)
    build = sb.create_session("build", startup="export STAGE=built")
    command = "echo out $STAGE; echo err >&2; echo out2; (exit 3)"
    stream = build.stream(command, stderr="separate")
    chunks = list(stream.chunks())
    assert b"".join(c.data for c in chunks if c.fd == 1) == b"out built\nout2\n"
    assert b"".join(c.data for c in chunks if c.fd == 2) == b"err\n"
    assert stream.result is not None
    assert (stream.result.exit_code, stream.result.output, stream.result.stderr) == (3, "", "")

    plain = sb.stream(command, stderr="separate")  # the default session: no STAGE
    assert b"".join(plain) == b"out\nout2\n"
    assert bytes(plain.stderr) == b"err\n"  # what the plain iteration stepped over
    merged = sb.stream("echo err >&2")
    assert [(c.fd, c.data) for c in merged.chunks()] == [(1, b"err\n")]
    assert merged.result is not None and merged.result.stderr is None

    with pytest.raises(SandmanClientError) as missing:
        sb.stream("true", session="nope")
    assert (missing.value.status, missing.value.code) == (404, "no_session")
