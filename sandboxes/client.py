"""A Python client for trainers: Sandman's REST API and each sandbox's execd.

Standard library only (``http.client`` + ``json``; ``execd.protocol``, itself standard
library, for the shapes of execd's answers), so a trainer can vendor it with that file.

    client = Client("http://sandman:8000", token)
    job = client.job(name="run-7", egress="deny", pacing={"rate_per_s": 20, "burst": 20})
    with job.acquire(image="sandman/empty", spec={"cpu": "1", "memory": "1Gi"}) as sb:
        print(sb.run("echo hi").output)
        sb.write("a.txt", "hello\\n")
        assert sb.read("a.txt").content == "hello\\n"
    # leaving the block releases the sandbox, also when the block raised

Rules a reader must not break:
* Every error (REST or execd) surfaces as ``SandmanClientError(status, code, detail)``.
* execd answers are read through ``execd.protocol``'s shapes, never with guessed defaults:
  an answer of another shape is ``SandmanClientError(status, "bad_response", ...)``.
* execd calls go straight to the sandbox's ``address`` with ``Authorization: Bearer``,
  on one keep-alive connection per sandbox; REST calls use one keep-alive connection
  per thread (``http.client`` connections are not thread-safe).
* A request is retried once, and only when a REUSED keep-alive connection turned out
  to be closed by the server before any answer (the usual idle-close race); a fresh
  connection's failure is raised as it is. Acquire and release carry an
  ``Idempotency-Key`` (one per call) and are resent with that same key after a connection
  error, a timeout or a ``503 controller_unavailable`` (a standby's answer while the
  replicas fail over): the service answers a retry with the first call's sandbox, never a
  second one, and a retried release is a no-op. Resends back off (0.1 s doubling to 2 s,
  or the server's ``Retry-After``) until ``failover_s`` after the first failure; then the
  last failure is raised.
* Every mutating execd call (each POST but the file reads) carries its own
  ``Idempotency-Key`` and is resent with it after a connection error or timeout: execd
  answers the resend with the first call's answer (waiting while it runs), so a command
  cut off in flight runs once. ``Sandbox.stream`` is not resent (its output is gone).
* A ``Sandbox`` is safe to share between threads: each thread talks to execd on its own
  connection (execd answers a second concurrent command 409 ``busy``).
* A sandbox the service took back (its lifetime ran out, or its backend lost it) raises
  ``SandboxReclaimed`` with the service's reason, not a connection error; ``release()``
  of a released or reclaimed sandbox is a no-op.
"""

from __future__ import annotations

import http.client
import itertools
import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote, urlencode, urlsplit

from execd import streaming
from execd.protocol import (
    BackgroundHandle,
    BackgroundStatus,
    DeletedAnswer,
    EnvAnswer,
    EnvRequest,
    ErrorAnswer,
    ExecAnswer,
    ExecRequest,
    HealthAnswer,
    InterruptAnswer,
    ProbeAnswer,
    ProtocolError,
    ReadAnswer,
    ReadBytesAnswer,
    ReadBytesRequest,
    ReadRequest,
    ResetAnswer,
    SessionAnswer,
    SessionRequest,
    SessionsAnswer,
    SignalAnswer,
    SignalRequest,
    WriteAnswer,
    WriteRequest,
)

T = TypeVar("T")

_RETRYABLE = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)
# A keyed REST call is resent after these transport failures and this refusal (a failover).
_TRANSPORT_FAILURES = frozenset(["connection_failed", "timeout"])
_FAILOVER_REFUSAL = (503, "controller_unavailable")
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.1, 2.0
# execd's POST routes that change nothing (execd.idempotency.READS): sent without a key.
_EXECD_READS = frozenset(["/files/read", "/files/read_bytes"])


class SandmanClientError(Exception):
    """An error answer (or a failed connection: status 0) from Sandman or execd."""

    def __init__(self, status: int, code: str, detail: str, body: Any = None) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.body = body


class SandboxReclaimed(SandmanClientError):
    """The service took the sandbox back (``reason``: e.g. ``max_lifetime``)."""

    def __init__(self, sandbox_id: int, state: str, reason: str) -> None:
        detail = f"sandbox {sandbox_id} was reclaimed by the service ({reason}; now {state})"
        super().__init__(410, "reclaimed", detail, {"state": state, "reason": reason})
        self.sandbox_id = sandbox_id
        self.state = state
        self.reason = reason


# --- HTTP plumbing --------------------------------------------------------------------------


class _Connection:
    """One keep-alive HTTP/1.1 connection to ``host:port`` with JSON helpers."""

    def __init__(self, host: str, port: int, *, https: bool, timeout_s: float) -> None:
        klass = http.client.HTTPSConnection if https else http.client.HTTPConnection
        self._conn = klass(host, port, timeout=timeout_s)
        self._used = False

    def close(self) -> None:
        self._conn.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None,
        headers: dict[str, str],
        timeout_s: float | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        for attempt in (1, 2):
            reused = self._used and self._conn.sock is not None
            try:
                if timeout_s is not None:
                    self._conn.timeout = timeout_s
                    if self._conn.sock is not None:
                        self._conn.sock.settimeout(timeout_s)
                self._conn.request(method, path, body=body, headers=headers)
                response = self._conn.getresponse()
                data = response.read()
                self._used = True
                return response.status, {k.lower(): v for k, v in response.getheaders()}, data
            except _RETRYABLE as exc:
                self._conn.close()
                if reused and attempt == 1:
                    continue
                raise SandmanClientError(0, "connection_failed", str(exc)) from exc
            except (OSError, http.client.HTTPException) as exc:
                self._conn.close()
                if isinstance(exc, socket.timeout | TimeoutError):
                    raise SandmanClientError(0, "timeout", f"{method} {path}: {exc}") from exc
                raise SandmanClientError(0, "connection_failed", f"{method} {path}: {exc}") from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def open(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None,
        headers: dict[str, str],
        timeout_s: float,
    ) -> http.client.HTTPResponse:
        """Send a request and return the response unread (a streamed answer); the
        caller reads it to its end or closes this connection. Not retried."""
        try:
            self._conn.timeout = timeout_s
            if self._conn.sock is not None:
                self._conn.sock.settimeout(timeout_s)
            self._conn.request(method, path, body=body, headers=headers)
            response = self._conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            self._conn.close()
            if isinstance(exc, socket.timeout | TimeoutError):
                raise SandmanClientError(0, "timeout", f"{method} {path}: {exc}") from exc
            raise SandmanClientError(0, "connection_failed", f"{method} {path}: {exc}") from exc
        self._used = True
        return response


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SandmanClientError(0, "bad_address", f"sandbox address {address!r} is not host:port")
    return host.strip("[]"), int(port)


def _decode(status: int, data: bytes) -> Any:
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError as exc:
        if status >= 400:
            return None
        raise SandmanClientError(status, "bad_response", "answer is not JSON") from exc


def _raise_for(status: int, payload: Any) -> None:
    if status >= 400:
        raise _error_for(status, payload)


def _error_for(status: int, payload: Any) -> SandmanClientError:
    if isinstance(payload, dict):
        code = str(payload.get("error") or payload.get("code") or "error")
        detail = str(payload.get("detail") or payload.get("message") or payload)
    else:
        code, detail = "error", f"HTTP {status}"
    return SandmanClientError(status, code, detail, payload)


def _retry_after_s(headers: dict[str, str]) -> float | None:
    """``Retry-After`` in seconds (the HTTP-date form, which Sandman never sends: None)."""
    try:
        return max(0.0, float(headers.get("retry-after", "")))
    except ValueError:
        return None


def _execd_error(status: int, payload: Any, route: str) -> SandmanClientError:
    """execd's ``{"error", "detail"}`` answer as an error; any other body is bad_response."""
    try:
        answer = ErrorAnswer.from_json(payload, route)
    except ProtocolError as exc:
        return SandmanClientError(status, "bad_response", str(exc), payload)
    return SandmanClientError(status, answer.error, answer.detail, payload)


# --- execd results ------------------------------------------------------------------------


@dataclass(frozen=True)
class RunResult:
    exit_code: int | None
    output: str
    output_bytes: int = 0
    truncated: bool = False
    duration_ms: float = 0.0
    error: str | None = None
    timed_out: bool = False  # execd's timeout, not a command's own exit 124
    shell_restarted: bool = False
    error_code: str | None = None  # execd.protocol.ERROR_CODES
    stderr: str | None = None  # only with stderr="separate"

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.error


@dataclass(frozen=True)
class StreamChunk:
    """One piece of a streamed command's output as execd read it: ``fd`` 1 is the output
    (stdout and stderr joined, or stdout alone with ``stderr="separate"``), 2 is stderr
    (only with ``stderr="separate"``). Across the two, chunks come in the order execd
    drained its two pipes, not in the exact order the command wrote them."""

    fd: int
    data: bytes


class ExecStream:
    """A streamed command (``Sandbox.stream``): iterate for its output bytes as execd
    reads them (with ``stderr="separate"``: stdout; stderr's bytes collect in
    ``stderr``), or iterate ``chunks()`` for both streams told apart; ``result`` is the
    final answer once the iteration ended (its ``output`` and ``stderr`` hold only what was
    not streamed, e.g. a syntax error's diagnostic). A stream cut short, or not ending in
    exactly one final frame, raises ``SandmanClientError`` (``stream_broken``) - never a
    guessed exit status. Leaving the iteration early closes the connection (the command
    runs on in the sandbox to its own end)."""

    READ = 1 << 20

    def __init__(self, conn: _Connection, response: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._response = response
        self.result: RunResult | None = None
        self.stderr = bytearray()  # stderr chunks the plain iteration stepped over
        self._frames = self._read()

    def __iter__(self) -> ExecStream:
        return self

    def __enter__(self) -> ExecStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __next__(self) -> bytes:
        while True:
            chunk = next(self._frames)
            if chunk.fd == 1:
                return chunk.data
            self.stderr += chunk.data

    def chunks(self) -> Iterator[StreamChunk]:
        """The rest of the output as ``StreamChunk``s, stdout and stderr told apart."""
        return self._frames

    def close(self) -> None:
        if self.result is None:
            self._conn.close()

    def _read(self) -> Iterator[StreamChunk]:
        route = "POST /exec"
        decoder = streaming.StreamDecoder()
        try:
            while True:
                try:
                    data = self._response.read1(self.READ)
                except (OSError, http.client.HTTPException) as exc:
                    raise streaming.StreamError(f"the stream broke: {exc}") from exc
                if not data:
                    decoder.close()
                    break
                for event in decoder.feed(data):
                    if event.kind == streaming.OUTPUT:
                        yield StreamChunk(1, event.data)
                    elif event.kind == streaming.STDERR:
                        yield StreamChunk(2, event.data)
                    elif event.kind == streaming.ERROR:
                        raise _execd_error(500, event.json(), route)
                    else:
                        answer = ExecAnswer.from_json(event.json())
                        self.result = _run_result(answer)
        except (streaming.StreamError, ProtocolError, ValueError) as exc:
            self._conn.close()
            raise SandmanClientError(0, "stream_broken", str(exc)) from exc
        except BaseException:
            self._conn.close()
            raise


class BackgroundCommand:
    """A command started with ``Sandbox.start``: it runs beside the sandbox's shell.
    ``poll(offset)`` reads its status and output from byte ``offset``; ``signal`` reaches
    its process group; ``wait`` polls until it ended."""

    def __init__(self, sandbox: Sandbox, handle: BackgroundHandle) -> None:
        self.sandbox = sandbox
        self.id = handle.id
        self.pid = handle.pid

    def __repr__(self) -> str:
        return f"<BackgroundCommand {self.id} pid {self.pid}>"

    def poll(self, offset: int = 0, max_bytes: int | None = None) -> BackgroundStatus:
        query = {"offset": offset} | ({} if max_bytes is None else {"max_bytes": max_bytes})
        path = f"/exec/{self.id}?{urlencode(query)}"
        return self.sandbox._execd_json(BackgroundStatus.from_json, "GET", path)[0]

    def signal(self, signal: str | int = "TERM") -> int:
        """Send ``signal`` (a name like ``INT`` or a number) to its process group."""
        payload = SignalRequest(signal).to_json()
        path = f"/exec/{self.id}/signal"
        return self.sandbox._execd_json(SignalAnswer.from_json, "POST", path, payload)[0].signal

    def wait(self, *, timeout_s: float = 300.0, poll_s: float = 0.05) -> BackgroundStatus:
        """Poll until it ended; its whole kept output is then in ``output``."""
        end = time.monotonic() + timeout_s
        while (status := self.poll()).running:
            if time.monotonic() > end:
                raise SandmanClientError(0, "wait_timeout", f"{self!r} still runs")
            time.sleep(poll_s)
        return status


@dataclass(frozen=True)
class ReadResult:
    content: str
    size: int
    sha256: str
    raw: dict[str, Any]

    def __str__(self) -> str:
        return self.content


@dataclass(frozen=True)
class BytesResult:
    """``data`` from ``offset``; ``size`` and ``sha256`` are the WHOLE file's."""

    data: bytes
    size: int
    sha256: str
    offset: int = 0
    complete: bool = True


@dataclass(frozen=True)
class WriteResult:
    size: int
    sha256: str


class Session:
    """A named persistent shell in a sandbox (``Sandbox.create_session``): its own cwd,
    variables and functions, running beside the sandbox's other sessions."""

    def __init__(self, sandbox: Sandbox, name: str, startup: RunResult | None = None) -> None:
        self.sandbox = sandbox
        self.name = name
        self.startup = startup  # the startup script's result when the session was created

    def __repr__(self) -> str:
        return f"<Session {self.name} of sandbox {self.sandbox.sandbox_id}>"

    def run(self, command: str, **kwargs: Any) -> RunResult:
        """``Sandbox.run`` in this session (same keyword arguments)."""
        return self.sandbox.run(command, session=self.name, **kwargs)

    def stream(self, command: str, **kwargs: Any) -> ExecStream:
        """``Sandbox.stream`` in this session (same keyword arguments)."""
        return self.sandbox.stream(command, session=self.name, **kwargs)

    def interrupt(self) -> bool:
        """SIGINT to this session's running foreground job; False when none was running."""
        return self.sandbox.interrupt(self.name)

    def close(self) -> None:
        """Delete the session: its shell and every process it started end."""
        self.sandbox.delete_session(self.name)


def _run_result(answer: ExecAnswer) -> RunResult:
    return RunResult(
        exit_code=answer.exit_code,
        output=answer.output,
        output_bytes=answer.output_bytes,
        truncated=answer.truncated,
        duration_ms=answer.duration_ms,
        error=answer.error,
        timed_out=answer.timed_out,
        shell_restarted=answer.shell_restarted,
        error_code=answer.error_code,
        stderr=answer.stderr,
    )


# --- the sandbox (execd) ------------------------------------------------------------------


class Sandbox:
    """An acquired sandbox: execd at ``address``; a context manager that releases on exit."""

    def __init__(
        self,
        client: Client,
        *,
        sandbox_id: int,
        name: str,
        address: str,
        token: str,
        source: str,
        wait_ms: float,
        queue_ms: float,
    ) -> None:
        self.client = client
        self.sandbox_id = sandbox_id
        self.name = name
        self.address = address
        self.source = source
        self.wait_ms = wait_ms
        self.queue_ms = queue_ms
        self._token = token
        self._local = threading.local()  # this thread's execd connection
        self._conns: list[_Connection] = []
        self._conns_lock = threading.Lock()
        self._released = False
        self.verdict: str | None = None

    def __repr__(self) -> str:  # never shows the token
        return f"<Sandbox {self.sandbox_id} {self.name} at {self.address} ({self.source})>"

    # context manager: release on any exit
    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._released:
            return
        try:
            self.release(verdict=self.verdict)
        except SandmanClientError as failed:
            if exc is None:
                raise
            # Keep the block's own error; the failed release rides along as a note.
            exc.add_note(f"and releasing sandbox {self.sandbox_id} failed: {failed}")

    @property
    def _conn(self) -> _Connection | None:
        """This thread's execd connection (None before its first call)."""
        return getattr(self._local, "conn", None)

    def _close_connections(self) -> None:
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        self._local = threading.local()

    def _connection(self) -> _Connection:
        conn = self._conn
        if conn is None:
            host, port = _split_address(self.address)
            conn = _Connection(host, port, https=False, timeout_s=self.client.timeout_s)
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def _execd(
        self, method: str, path: str, payload: Any = None, *, timeout_s: float | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = self._connection()
        headers = {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}
        body = None
        if payload is not None:
            body = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        keyed = method == "POST" and path not in _EXECD_READS
        if keyed:  # execd runs a keyed call once: a resend after a cut cannot run it twice
            headers["Idempotency-Key"] = uuid.uuid4().hex
        for attempt in range(self.client.RETRIES + 1):
            try:
                return conn.request(method, path, body=body, headers=headers, timeout_s=timeout_s)
            except SandmanClientError as exc:
                lost = exc.status == 0 and exc.code in ("connection_failed", "timeout")
                if not (keyed and lost) or attempt == self.client.RETRIES:
                    if exc.status == 0 and exc.code == "connection_failed":
                        self._raise_if_reclaimed(exc)
                    raise
                time.sleep(0.1 * 2**attempt)  # back off: execd may be busy accepting
        raise AssertionError("unreachable")  # pragma: no cover

    def _raise_if_reclaimed(self, cause: SandmanClientError) -> None:
        """execd is unreachable: if the service no longer counts the sandbox as ours,
        say why (``SandboxReclaimed``); otherwise the connection error stands."""
        try:
            row = self.client.sandbox(self.sandbox_id)
        except SandmanClientError:
            return
        state = str(row.get("state", ""))
        if state == "in_use":
            return
        reason = str(row.get("failure_reason") or "")
        for event in reversed(row.get("events") or []):
            if event.get("kind") == "reclaimed":
                reason = str((event.get("detail") or {}).get("reason") or reason)
                break
        raise SandboxReclaimed(self.sandbox_id, state, reason or state) from cause

    def _execd_json(
        self,
        parse: Callable[[Any], T],
        method: str,
        path: str,
        payload: Any = None,
        *,
        timeout_s: float | None = None,
    ) -> tuple[T, Any]:
        """The answer read with its protocol shape's ``parse``, and the decoded JSON."""
        status, _, data = self._execd(method, path, payload, timeout_s=timeout_s)
        decoded = _decode(status, data)
        if status >= 400:
            raise _execd_error(status, decoded, f"{method} {path}")
        try:
            return parse(decoded), decoded
        except ProtocolError as exc:
            raise SandmanClientError(status, "bad_response", str(exc), decoded) from exc

    def health(self) -> dict[str, Any]:
        return self._execd_json(HealthAnswer.from_json, "GET", "/health")[1]

    def run(
        self,
        command: str,
        *,
        timeout_s: float = 300.0,
        cwd: str | None = None,
        isolate: bool = False,
        max_output_bytes: int | None = None,
        session: str | None = None,
        stderr: str = "merged",
    ) -> RunResult:
        """Run one command in the sandbox's persistent shell (``session``: a named one);
        ``cwd`` for this call only, ``isolate``: in a subshell whose ``cd``, ``export`` or
        ``exit`` do not last; ``stderr="separate"``: stderr in ``RunResult.stderr``."""
        payload = ExecRequest(
            command,
            timeout_s=timeout_s,
            cwd=cwd,
            isolate=isolate or None,
            max_output_bytes=max_output_bytes,
            session=session,
            stderr=None if stderr == "merged" else stderr,
        ).to_json()
        # The HTTP wait must outlast execd's own timeout so execd's answer arrives.
        answer, _ = self._execd_json(
            ExecAnswer.from_json, "POST", "/exec", payload, timeout_s=timeout_s + 30.0
        )
        return _run_result(answer)

    def stream(
        self,
        command: str,
        *,
        timeout_s: float = 300.0,
        cwd: str | None = None,
        isolate: bool = False,
        max_output_bytes: int | None = None,
        session: str | None = None,
        stderr: str = "merged",
    ) -> ExecStream:
        """Run one command like ``run`` and iterate over its output as it comes
        (``for chunk in sb.stream(cmd)``; then ``.result``). Without ``max_output_bytes``
        up to the sandbox's per-call limit is streamed (with ``stderr="separate"``, as
        much again of stderr: ``ExecStream.chunks()`` tells the two apart)."""
        payload = ExecRequest(
            command,
            timeout_s=timeout_s,
            cwd=cwd,
            isolate=isolate or None,
            max_output_bytes=max_output_bytes,
            session=session,
            stderr=None if stderr == "merged" else stderr,
            stream=True,
        ).to_json()
        conn = self._connection()
        headers = {
            "Authorization": f"Bearer {self._token}",
            "Accept": streaming.CONTENT_TYPE,
            "Content-Type": "application/json",
        }
        response = conn.open(
            "POST",
            "/exec",
            body=json.dumps(payload).encode(),
            headers=headers,
            timeout_s=timeout_s + 30.0,
        )
        kind = (response.getheader("Content-Type") or "").split(";")[0].strip()
        if response.status != 200 or kind != streaming.CONTENT_TYPE:
            data = response.read()
            decoded = _decode(response.status, data)
            if response.status >= 400:
                raise _execd_error(response.status, decoded, "POST /exec")
            conn.close()
            raise SandmanClientError(response.status, "bad_response", f"not a stream: {kind!r}")
        return ExecStream(conn, response)

    def start(
        self,
        command: str,
        *,
        cwd: str | None = None,
        timeout_s: float | None = None,
        max_output_bytes: int | None = None,
    ) -> BackgroundCommand:
        """Start ``command`` in the background (a fresh ``bash -c`` beside the shell, with
        the environment the shell started with); no timeout unless ``timeout_s``."""
        payload = ExecRequest(
            command,
            timeout_s=timeout_s,
            cwd=cwd,
            max_output_bytes=max_output_bytes,
            background=True,
        ).to_json()
        handle, _ = self._execd_json(BackgroundHandle.from_json, "POST", "/exec", payload)
        return BackgroundCommand(self, handle)

    # sessions: named shells beside the default one
    def create_session(
        self, name: str, *, startup: str | None = None, startup_timeout_s: float | None = None
    ) -> Session:
        """A new named shell; ``startup`` runs in it first (after the job's own startup
        script), and again whenever the session's shell restarts."""
        payload = SessionRequest(name, startup, startup_timeout_s).to_json()
        timeout = (startup_timeout_s or 300.0) + 30.0
        answer, _ = self._execd_json(
            SessionAnswer.from_json, "POST", "/sessions", payload, timeout_s=timeout
        )
        ran = None
        if answer.startup is not None:
            try:
                ran = _run_result(ExecAnswer.from_json(answer.startup))
            except ProtocolError as exc:
                raise SandmanClientError(200, "bad_response", str(exc), answer.startup) from exc
        return Session(self, answer.name, ran)

    def sessions(self) -> list[dict[str, Any]]:
        """Every session (``name``, ``pid``, ``alive``, ``busy``), ``default`` first."""
        return self._execd_json(SessionsAnswer.from_json, "GET", "/sessions")[0].sessions

    def delete_session(self, name: str) -> list[int]:
        """End a session's shell and everything it started; returns the pids killed."""
        path = f"/sessions/{quote(name, safe='')}"
        return self._execd_json(DeletedAnswer.from_json, "DELETE", path)[0].killed

    def interrupt(self, session: str = "default") -> bool:
        """SIGINT to the session's running foreground job (its other jobs and other
        sessions keep running); the interrupted ``run`` answers ``error_code
        "interrupted"``. False when nothing was running."""
        path = f"/sessions/{quote(session, safe='')}/interrupt"
        return self._execd_json(InterruptAnswer.from_json, "POST", path, {})[0].interrupted

    def read(
        self, path: str, *, start_line: int | None = None, max_lines: int | None = None
    ) -> ReadResult:
        """A UTF-8 text window; ``size`` and ``sha256`` are of the WHOLE file."""
        first = start_line if start_line is not None else 1
        payload = ReadRequest(path, start_line=first, max_lines=max_lines).to_json()
        answer, body = self._execd_json(ReadAnswer.from_json, "POST", "/files/read", payload)
        return ReadResult(content=answer.content, size=answer.size, sha256=answer.sha256, raw=body)

    def read_bytes(self, path: str, *, offset: int = 0, length: int | None = None) -> BytesResult:
        """The exact bytes of a file, or ``length`` of them from ``offset`` (base64 in
        execd's JSON answer); ``size``/``sha256`` are the whole file's."""
        payload = ReadBytesRequest(path, offset, length).to_json()
        answer, body = self._execd_json(
            ReadBytesAnswer.from_json, "POST", "/files/read_bytes", payload
        )
        try:
            data = answer.data()
        except ProtocolError as exc:
            raise SandmanClientError(200, "bad_response", str(exc), body) from exc
        return BytesResult(
            data=data,
            size=answer.size,
            sha256=answer.sha256,
            offset=answer.offset,
            complete=answer.complete,
        )

    def write(
        self,
        path: str,
        content: str | bytes,
        *,
        expected_sha256: str | None = None,
        mode: int | str | None = None,
        make_parents: bool = False,
    ) -> WriteResult:
        """Atomic write; with ``expected_sha256`` execd refuses (409) if the file changed."""
        payload = WriteRequest.of(path, content, expected_sha256, mode, make_parents).to_json()
        answer, _ = self._execd_json(WriteAnswer.from_json, "POST", "/files/write", payload)
        return WriteResult(size=answer.size, sha256=answer.sha256)

    def env(self) -> dict[str, str]:
        return self._execd_json(EnvAnswer.from_json, "GET", "/env")[0].env

    def set_env(self, set: dict[str, str] | None = None, unset: list[str] | None = None) -> Any:  # noqa: A002
        """Returns execd's answer ``{"env": {...}}``: the shell's environment afterwards."""
        payload = EnvRequest(set or {}, unset or []).to_json()
        return self._execd_json(EnvAnswer.from_json, "POST", "/env", payload)[1]

    def reset(self) -> Any:
        """Kill every process the sandbox started and restart its shell (execd's answer:
        ``killed``, ``survivors``, ``shell_alive``, ``duration_ms``)."""
        return self._execd_json(ResetAnswer.from_json, "POST", "/reset", {})[1]

    def probe(self) -> dict[str, Any]:
        return self._execd_json(ProbeAnswer.from_json, "GET", "/probe")[1]

    def release(
        self,
        *,
        verdict: str | None = None,
        patch_sha256: str | None = None,
        suite: str | None = None,
    ) -> None:
        """Give the sandbox back; closes the execd connections. Idempotent: a second call,
        or a release of a sandbox the service already took back, does nothing."""
        if self._released:
            return
        self._close_connections()
        outcome: dict[str, Any] | None = None
        if verdict is not None:
            outcome = {"verdict": verdict}
            if patch_sha256 is not None:
                outcome["patch_sha256"] = patch_sha256
            if suite is not None:
                outcome["suite"] = suite
        try:
            self.client._call(
                "POST",
                f"/api/v1/sandboxes/{self.sandbox_id}/release/",
                {"outcome": outcome} if outcome else {},
                idempotency_key=uuid.uuid4().hex,
            )
        except SandmanClientError as exc:
            if exc.code != "already_released":  # released before, or reclaimed meanwhile
                raise  # (a lost sandbox's 409 sandbox_lost stays an error: it says why)
        self._released = True

    def renew(self, ttl_s: float) -> str:
        """Keep the sandbox at least ``ttl_s`` more seconds before the service reclaims it
        at its job's ``max_lifetime_s``; returns the new deadline (ISO 8601)."""
        answer = self.client._call(
            "POST", f"/api/v1/sandboxes/{self.sandbox_id}/renew/", {"ttl_s": ttl_s}
        )
        return str(answer["expires_at"])

    @property
    def released(self) -> bool:
        return self._released


# --- jobs and the REST client ---------------------------------------------------------------


class Job:
    """A registered job; acquire, prewarm and drain act on its pool."""

    def __init__(self, client: Client, data: dict[str, Any]) -> None:
        self.client = client
        self.data = data
        self.id: int = data["id"]
        self.name: str = data["name"]

    def __repr__(self) -> str:
        return f"<Job {self.id} {self.name} {self.data.get('state')}>"

    def refresh(self) -> Job:
        self.data = self.client._call("GET", f"/api/v1/jobs/{self.id}/")
        return self

    @property
    def counts(self) -> dict[str, int]:
        return dict(self.data.get("counts", {}))

    def acquire(
        self,
        *,
        image: str,
        spec: dict[str, Any],
        role: str = "rollout",
        base_commit: str | None = None,
        timeout_s: float | None = None,
    ) -> Sandbox:
        payload: dict[str, Any] = {"image": image, "spec": spec, "role": role}
        if base_commit is not None:
            payload["base_commit"] = base_commit
        if timeout_s is not None:
            payload["timeout_s"] = timeout_s
        http_timeout = None if timeout_s is None else max(self.client.timeout_s, timeout_s + 30.0)
        body = self.client._call(
            "POST",
            f"/api/v1/jobs/{self.id}/acquire/",
            payload,
            timeout_s=http_timeout,
            idempotency_key=uuid.uuid4().hex,
        )
        return Sandbox(
            self.client,
            sandbox_id=body["sandbox_id"],
            name=body.get("name", ""),
            address=body["address"],
            token=body["token"],
            source=body["source"],
            wait_ms=float(body["wait_ms"]),
            queue_ms=float(body["queue_ms"]),
        )

    def prewarm(self, keys: list[dict[str, Any]]) -> dict[str, Any]:
        """``keys``: ``[{image, base_commit?, spec, count}]``; returns at once (202)."""
        return self.client._call("POST", f"/api/v1/jobs/{self.id}/prewarm/", {"keys": keys})

    def drain(self) -> dict[str, Any]:
        """Delete everything of the job; returns at once (202)."""
        return self.client._call("POST", f"/api/v1/jobs/{self.id}/drain/", {})

    def delete(self) -> None:
        """Forget the job once drained (409 ``job_not_drained`` before)."""
        self.client._call("DELETE", f"/api/v1/jobs/{self.id}/")

    def sandboxes(self, *, state: str | None = None, role: str | None = None) -> list[dict]:
        return self.client.sandboxes(job=self.id, state=state, role=role)

    def report_trajectories(self, trajectories: list[dict[str, Any]]) -> dict[str, int]:
        """Trajectories in the wire format (docs/architecture.md §5), sent 10,000 a call.

        Idempotent by id: resending after a timeout is safe. Returns the summed counts.
        """
        return self._report("trajectories", "trajectories", trajectories)

    def report_steps(self, steps: list[dict[str, Any]]) -> dict[str, int]:
        """Learner steps in the wire format, sent 10,000 a call; idempotent by step number."""
        return self._report("learner-steps", "steps", steps)

    def critical_path(self, *, start: float | None = None, end: float | None = None) -> dict:
        """Appendix J shares of the job's steps inside ``[start, end]`` (epoch seconds)."""
        query = {k: v for k, v in (("from", start), ("to", end)) if v is not None}
        path = f"/api/v1/jobs/{self.id}/critical-path/"
        if query:
            path += "?" + urlencode(query)
        return self.client._call("GET", path)

    def _report(self, route: str, key: str, records: list[dict[str, Any]]) -> dict[str, int]:
        totals = {"received": 0, "stored": 0, "duplicates": 0}
        for i in range(0, len(records), 10_000):
            body = {key: records[i : i + 10_000]}
            answer = self.client._call("POST", f"/api/v1/jobs/{self.id}/{route}/", body)
            for name in totals:
                totals[name] += int(answer[name])
        return totals

    def grade(
        self,
        *,
        task: str,
        patch: str | None = None,
        capture_id: int | None = None,
        suites: list[str] | None = None,
        task_set: int | None = None,
        shadow: bool | None = None,
    ) -> Grading:
        """Queue a grading of ``patch`` (or a stored capture) on ``task``; ``wait()`` on it.

        With ``task_set`` the service grades only if that set's certification matches this
        job's configuration and admitted the task (a 409 ``not_certified`` otherwise).
        ``shadow``: grade it again on a never-used sandbox and record the agreement."""
        body = {"job": self.id, "task": task, "patch": patch, "capture_id": capture_id}
        body.update(suites=suites, task_set=task_set, shadow=shadow)
        answer = self.client._call(
            "POST", "/api/v1/gradings/", {k: v for k, v in body.items() if v is not None}
        )
        return Grading(self.client, int(answer["id"]))


class Grading:
    """A grading as the service stores it; ``wait()`` polls until it has a verdict."""

    def __init__(self, client: Client, grading_id: int) -> None:
        self.client, self.id = client, grading_id
        self.data: dict[str, Any] = {}

    def refresh(self) -> Grading:
        self.data = self.client._call("GET", f"/api/v1/gradings/{self.id}/")
        return self

    @property
    def verdict(self) -> str:
        """``resolved`` | ``unresolved`` | ``no_verdict`` (resample); empty until done."""
        return str(self.data.get("verdict", ""))

    def wait(self, *, timeout_s: float = 3600.0, poll_s: float = 1.0) -> Grading:
        """Poll until the grading is done; ``SandmanClientError(0, "wait_timeout")`` if not."""
        end = time.monotonic() + timeout_s
        while self.refresh().data.get("state") != "done":
            if time.monotonic() > end:
                raise SandmanClientError(0, "wait_timeout", f"grading {self.id} not done")
            time.sleep(poll_s)
        return self


class Client:
    """Sandman's REST API at ``base_url`` with a DRF token (``Authorization: Token``)."""

    RETRIES = 3  # resends of a keyed execd call after a connection error

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout_s: float = 600.0,
        failover_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        """``failover_s``: how long a keyed call (acquire, release) keeps resending after
        its first failure -- a Lease duration (15 s), a retry period and the new leader's
        reconcile fit in the default."""
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url {base_url!r} must be http(s)://host[:port]")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        self._prefix = parts.path.rstrip("/")
        self._token = token
        self.timeout_s = timeout_s
        self.failover_s = failover_s
        self._clock, self._sleep = clock, sleep
        self._local = threading.local()
        self._all: list[_Connection] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"<Client {self._host}:{self._port}{self._prefix}>"

    def _connection(self) -> _Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _Connection(self._host, self._port, https=self._https, timeout_s=self.timeout_s)
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.close()
            self._all.clear()
        self._local = threading.local()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(
        self,
        method: str,
        path: str,
        payload: Any = None,
        *,
        query: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        idempotency_key: str | None = None,
    ) -> Any:
        """One REST call; with ``idempotency_key`` it is resent (same key) after a
        connection error, a timeout or a failover's 503, for up to ``failover_s``."""
        headers = {"Authorization": f"Token {self._token}", "Accept": "application/json"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        body = None
        if payload is not None:
            body = json.dumps(payload).encode()
            headers["Content-Type"] = "application/json"
        url = self._prefix + path
        if query:
            clean = {k: v for k, v in query.items() if v is not None}
            if clean:
                url += "?" + urlencode(clean)
        deadline: float | None = None
        for attempt in itertools.count():
            asked: float | None = None  # the server's Retry-After
            try:
                status, answer_headers, data = self._connection().request(
                    method, url, body=body, headers=headers, timeout_s=timeout_s or self.timeout_s
                )
            except SandmanClientError as exc:
                if idempotency_key is None or exc.code not in _TRANSPORT_FAILURES:
                    raise
                failure = exc
            else:
                decoded = _decode(status, data)
                failure = _error_for(status, decoded)
                if idempotency_key is None or (status, failure.code) != _FAILOVER_REFUSAL:
                    _raise_for(status, decoded)
                    return decoded
                asked = _retry_after_s(answer_headers)
            now = self._clock()
            deadline = now + self.failover_s if deadline is None else deadline
            if now >= deadline:
                raise failure
            backoff = min(_BACKOFF_MAX_S, _BACKOFF_FIRST_S * 2**attempt)
            self._sleep(min(deadline - now, backoff if asked is None else asked))
        raise AssertionError("unreachable")  # pragma: no cover

    # jobs
    def job(self, *, name: str, egress: str = "deny", **policy: Any) -> Job:
        """Register a job. ``policy``: trainer_pod, pacing, caps, warm, readiness_budget_s,
        max_lifetime_s, reuse — the shapes of ``POST /api/v1/jobs/``."""
        body = {
            k: v for k, v in {"name": name, "egress": egress, **policy}.items() if v is not None
        }
        return Job(self, self._call("POST", "/api/v1/jobs/", body))

    def get_job(self, job_id: int) -> Job:
        return Job(self, self._call("GET", f"/api/v1/jobs/{job_id}/"))

    def jobs(self) -> list[Job]:
        return [Job(self, row) for row in self._paged("/api/v1/jobs/", {})]

    # sandboxes
    def sandboxes(
        self, *, job: int | None = None, state: str | None = None, role: str | None = None
    ) -> list[dict[str, Any]]:
        return self._paged("/api/v1/sandboxes/", {"job": job, "state": state, "role": role})

    def sandbox(self, sandbox_id: int) -> dict[str, Any]:
        return self._call("GET", f"/api/v1/sandboxes/{sandbox_id}/")

    def _paged(self, path: str, query: dict[str, Any]) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = self._call("GET", path, query={**query, "limit": 100, "offset": offset})
            rows.extend(page["results"])
            if not page.get("next"):
                return rows
            offset += len(page["results"])
