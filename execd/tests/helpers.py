"""Test helpers: an http.client keep-alive client for execd and /proc readers."""

import http.client
import json
import os
import signal
import subprocess
from typing import Any, Dict, List, Optional, Tuple

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKEN = "test-token-5f0c2a9e7b"


class Client:
    """Talks to one execd over a single keep-alive connection."""

    def __init__(self, port: int, token: Optional[str] = TOKEN, timeout: float = 120) -> None:
        self.port = port
        self.token = token
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        token: Any = "default",
        raw: Optional[bytes] = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> Tuple[int, Dict[str, Any]]:
        hdrs = dict(headers or {})
        tok = self.token if token == "default" else token
        if tok is not None:
            hdrs["Authorization"] = "Bearer " + tok
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        self.conn.request(method, path, body=data, headers=hdrs)
        resp = self.conn.getresponse()
        payload = resp.read()
        assert resp.getheader("Content-Length") == str(len(payload))
        return resp.status, json.loads(payload)

    def post(self, path: str, body: Any = None, **kw: Any) -> Dict[str, Any]:
        status, data = self.request("POST", path, body if body is not None else {}, **kw)
        assert status == 200, (status, data)
        return data

    def get(self, path: str) -> Dict[str, Any]:
        status, data = self.request("GET", path)
        assert status == 200, (status, data)
        return data

    def exec(self, command: str, **kw: Any) -> Dict[str, Any]:
        body = {"command": command}
        body.update(kw)
        return self.post("/exec", body)

    def close(self) -> None:
        self.conn.close()


class Execd:
    def __init__(self, proc: subprocess.Popen, port: int, workspace: str, run_dir: str) -> None:
        self.proc = proc
        self.port = port
        self.workspace = workspace
        self.run_dir = run_dir
        self.pid = proc.pid
        self.listening = ""  # the "listening on HOST:PORT" line it printed

    def client(self, **kw: Any) -> Client:
        return Client(self.port, **kw)

    def status(self) -> Dict[str, str]:
        out = {}
        with open("/proc/%d/status" % self.pid) as f:
            for line in f:
                key, _, val = line.partition(":")
                out[key] = val.strip()
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            # still here: SIGABRT makes execd's faulthandler print every thread's stack
            # to stderr (the assertion that follows shows it), then it dies
            self.proc.send_signal(signal.SIGABRT)
            try:
                return self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                return self.proc.wait()


# -- helpers used across test modules ------------------------------------------------


def proc_state(pid: int) -> Optional[str]:
    """The /proc state letter, or None when the pid is gone entirely."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(")") + 2]


def is_running(pid: int) -> bool:
    return proc_state(pid) not in (None, "Z", "X")


def read_pids(*paths: Any) -> List[int]:
    return [int(open(str(p)).read().split()[0]) for p in paths]


def ipv6_loopback() -> bool:
    """Whether this machine can listen on ::1 (the IPv6 pod IP tests need it)."""
    import socket

    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True
