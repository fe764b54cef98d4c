"""Helpers for tests over the shipped sample task set: images built once per module into a
directory the sandbox user can read, a controller whose local provider resolves
``sandman-sample/NAME`` there, the tasks imported through ``import_tasks``'s reader, and the
package index that the network task's tests call (``198.18.250.1:47865``, a host address
outside every sandbox that is not the host's loopback: egress-allowed sandboxes reach the
outside world through slirp4netns but never the host's 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.utils import timezone

from grading import samples, services
from grading.management.commands.import_tasks import parse_task_lines
from grading.models import Task

INDEX_ADDRESS = ("198.18.250.1", 47865)
# A veth pair (both ends on the host) carries the index address (RFC 2544's benchmarking
# range: on nothing but this machine), created and removed by package_index().
INDEX_LINK = "smpkgidx"
INDEX_VERSIONS = {"demo": ["1.2", "1.10", "1.9"]}


def sample_provider(root: Path, images_dir: Path) -> Any:
    from sandboxes.providers.local.provider import LocalProvider

    return LocalProvider(
        root=root,
        images_dir=images_dir,
        isolation_mode=settings.SANDMAN_LOCAL_ISOLATION,
        execd_python=settings.SANDMAN_EXECD_PYTHON,
    )


def import_samples(task_set: str = samples.TASK_SET) -> dict[str, Task]:
    """Store the shipped JSONL's tasks (as ``import_tasks`` would); by sample name."""
    tasks = parse_task_lines(samples.JSONL_PATH.read_text(encoding="utf-8"))
    services.task_import(created_by=None, now=timezone.now(), tasks=tasks, task_set=task_set)
    stored = {t.instance_id: t for t in Task.objects.all()}
    return {name: stored[f"sandman-sample__{name}-1"] for name in samples.NAMES}


class _Index(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        name = self.path.strip("/").split("/")[-1]
        body = json.dumps({"versions": INDEX_VERSIONS.get(name, [])}).encode()
        self.send_response(200 if name in INDEX_VERSIONS else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def package_index(deadline_s: float = 30.0) -> Iterator[None]:
    """Serve the sample package index at ``INDEX_ADDRESS`` on a veth interface of the host
    (outside every sandbox's network namespace, and not the host's loopback, which the
    egress guard refuses). Polls for the port with a deadline if another run holds it."""
    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("the package index's address needs root and iproute2")
    subprocess.run(["ip", "link", "del", INDEX_LINK], capture_output=True, timeout=30)
    for args in (
        ["link", "add", INDEX_LINK, "type", "veth", "peer", "name", f"{INDEX_LINK}p"],
        ["addr", "add", f"{INDEX_ADDRESS[0]}/32", "dev", INDEX_LINK],
        ["link", "set", INDEX_LINK, "up"],
        ["link", "set", f"{INDEX_LINK}p", "up"],
    ):
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)
    try:
        with _serve_index(deadline_s):
            yield
    finally:
        subprocess.run(["ip", "link", "del", INDEX_LINK], capture_output=True, timeout=30)


@contextmanager
def _serve_index(deadline_s: float) -> Iterator[None]:
    end = time.monotonic() + deadline_s
    while True:
        try:
            server = ThreadingHTTPServer(INDEX_ADDRESS, _Index)
            break
        except OSError:
            if time.monotonic() > end:
                raise
            threading.Event().wait(0.2)  # poll the port again, up to the deadline
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
