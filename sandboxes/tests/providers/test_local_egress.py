"""The local egress guard and the fences between sandboxes and the host (issue 12, item 4).

``allow`` means the outside world, not the host: an egress-allowed sandbox has its own
network namespace with slirp4netns (``usernet.py``), so a listener on the host's
127.0.0.1 is never reached (neither at 127.0.0.1, the sandbox's own loopback, nor through
slirp4netns's gateway 10.0.2.2, refused by ``--disable-host-loopback``). The stand-in for
"the outside world" is a test host this test creates itself: a network namespace joined
to the host by a veth pair, with addresses from 198.18.0.0/15 (RFC 2544's benchmarking
range, on nothing but this machine), serving HTTP. An egress-allowed sandbox reaches it;
an egress-denied one reaches nothing.

A sandbox cannot read another sandbox's workspace, the service's settings, database file
or secret key: none of them is mounted in, and the service's environment is not passed.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from django.conf import settings

from sandboxes.providers.local import LocalProvider
from sandboxes.tests.providers.local_support import destroy_all, make_spec, run_in

READY_BUDGET_S = 30.0
_TCP = "( exec 3<>/dev/tcp/{host}/{port} ) 2>&1 && echo CONNECTED || echo REFUSED"
_HTTP = (
    "exec 3<>/dev/tcp/{host}/{port} && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 "
    "&& head -1 <&3 || echo UNREACHABLE"
)


@dataclass(frozen=True)
class OutsideHost:
    address: str
    port: int


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture
def test_host() -> Iterator[OutsideHost]:
    """A network namespace with a veth link to the host and an HTTP server in it."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("creating a network namespace needs root and iproute2")
    # A fresh tag per use: a pid-derived one repeats across runs (pids are reused), and a
    # namespace or link an interrupted run left under that name made ``add`` fail.
    tag = secrets.randbelow(100000)
    netns, host_if, peer_if = f"sandman-th-{tag}", f"smh{tag}", f"smp{tag}"
    octet = tag % 250
    host_ip, peer_ip = f"198.18.{octet}.1", f"198.18.{octet}.2"
    for stale in (["link", "del", host_if], ["netns", "del", netns]):
        subprocess.run(["ip", *stale], capture_output=True, timeout=30)  # absent: fine
    _ip("netns", "add", netns)
    server = None
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", peer_if)
        _ip("link", "set", peer_if, "netns", netns)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", netns, "addr", "add", f"{peer_ip}/30", "dev", peer_if)
        _ip("-n", netns, "link", "set", peer_if, "up")
        _ip("-n", netns, "link", "set", "lo", "up")
        served = tempfile.mkdtemp(prefix="sandman-th-")
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-m", "http.server"]
            + ["--bind", peer_ip, "18080", "--directory", served],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while True:  # until the server accepts (polled, with a deadline)
            try:
                socket.create_connection((peer_ip, 18080), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.02)
        yield OutsideHost(peer_ip, 18080)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, timeout=30)
        _ip("netns", "del", netns)


@pytest.fixture
def local_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="sandman-test-root-", dir="/tmp"))
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest_asyncio.fixture
async def isolated(local_root: Path, tmp_path: Path) -> AsyncIterator[LocalProvider]:
    images = tmp_path / "images"
    images.mkdir()
    provider = LocalProvider(root=local_root, images_dir=images, isolation_mode="auto")
    runtime = await provider.runtime()
    if not runtime.isolated:
        pytest.skip(f"bubblewrap cannot isolate sandboxes on this host: {runtime.reason}")
    if runtime.usernet is None:
        pytest.skip("slirp4netns is not installed (scripts/setup.sh installs it)")
    yield provider
    await destroy_all(provider)
    await provider.close()


def _host_listener() -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    return listener


def _pending_connection(listener: socket.socket) -> bool:
    try:
        connection, _ = listener.accept()
    except BlockingIOError:
        return False
    connection.close()
    return True


async def _start(provider: LocalProvider, name: str, egress: str):
    spec = make_spec(name, egress=egress)
    handle = await provider.create(spec)
    info = await provider.wait_ready(handle, READY_BUDGET_S)
    return spec, handle, info


@pytest.mark.asyncio
async def test_allow_reaches_the_test_host_but_never_the_hosts_loopback(
    isolated: LocalProvider, test_host: OutsideHost
) -> None:
    listener = _host_listener()
    port = listener.getsockname()[1]
    try:
        spec, _, info = await _start(isolated, "sb-allow", "allow")
        assert info.guards["net_ns"] is True and info.guards["network"] == "usernet"
        assert info.guards["egress"] == "allowed"
        address, token = info.address, spec.token
        outside = await run_in(address, token, _HTTP.format(host=test_host.address, port=18080))
        assert outside["output"].startswith("HTTP/1.0 200"), outside
        for host in ("127.0.0.1", "10.0.2.2", "localhost"):
            answer = await run_in(address, token, _TCP.format(host=host, port=port))
            assert "REFUSED" in answer["output"] and "CONNECTED" not in answer["output"], host
        assert not _pending_connection(listener)
    finally:
        listener.close()


@pytest.mark.asyncio
async def test_deny_reaches_neither_the_test_host_nor_the_hosts_loopback(
    isolated: LocalProvider, test_host: OutsideHost
) -> None:
    listener = _host_listener()
    port = listener.getsockname()[1]
    try:
        spec, _, info = await _start(isolated, "sb-deny", "deny")
        assert info.guards["net_ns"] is True and info.guards["network"] == "none"
        address, token = info.address, spec.token
        outside = await run_in(address, token, _HTTP.format(host=test_host.address, port=18080))
        assert "UNREACHABLE" in outside["output"] and "HTTP/" not in outside["output"]
        for host in ("127.0.0.1", "10.0.2.2"):
            answer = await run_in(address, token, _TCP.format(host=host, port=port))
            assert "REFUSED" in answer["output"], host
        assert not _pending_connection(listener)
    finally:
        listener.close()


@pytest.mark.asyncio
async def test_slirp4netns_ends_with_its_sandbox(isolated: LocalProvider) -> None:
    spec, handle, info = await _start(isolated, "sb-net-life", "allow")
    live = isolated._live[spec.name]  # noqa: SLF001 - the test reads the provider's own table
    slirp = live.usernet
    assert slirp is not None and slirp.poll() is None
    await isolated.destroy(handle)
    assert slirp.poll() is not None  # exited and reaped by destroy: no orphan, no zombie
    assert not os.path.exists(f"/proc/{slirp.pid}")


@pytest.mark.asyncio
async def test_a_sandbox_reads_no_other_workspace_nor_the_services_files_or_secret(
    isolated: LocalProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secret = "fence-secret-key-4f1d9a"
    monkeypatch.setenv("SANDMAN_SECRET_KEY", secret)
    database = tmp_path / "sandman.sqlite3"
    database.write_text("SQLite format 3\0" + secret)
    database.chmod(0o644)
    other_spec, _, other = await _start(isolated, "sb-other", "allow")
    await run_in(other.address, other_spec.token, f"echo {secret} > /workspace/private.txt")
    spec, _, info = await _start(isolated, "sb-nosy", "deny")
    other_ws = isolated.root / "sb-other" / "workspace" / "private.txt"
    assert other_ws.read_text().strip() == secret  # it exists on the host
    settings_dir = Path(settings.BASE_DIR) / "sandman_site" / "settings"
    paths = [other_ws, database, settings_dir / "base.py", Path(settings.BASE_DIR) / "manage.py"]
    command = "; ".join(f"cat {p} 2>/dev/null && echo READ-{i}" for i, p in enumerate(paths))
    command += "; ls /workspace; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'; env"
    command += "; grep -rsl " + secret + " /etc /opt /run /tmp /workspace 2>/dev/null"
    answer = await run_in(info.address, spec.token, command)
    assert "READ-" not in answer["output"], answer
    assert secret not in answer["output"]
    assert "SANDMAN_SECRET_KEY" not in answer["output"]
    assert "private.txt" not in answer["output"]
