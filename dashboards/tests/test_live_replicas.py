"""Live pages update from either replica: the Channels layer on a real Redis.

A real ``redis-server`` (Debian's, started and stopped here) and two service replicas
(Daphne, production settings, ``SANDMAN_REDIS_URL``) on one PostgreSQL. An operator page
is connected to each replica's ``/ws/dashboard/``; a job created through the REST API of
one replica (its ``job.state`` push is published after commit in that process) reaches
the pages on BOTH replicas, whichever replica served the write.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.authtoken.models import Token

from sandman_site.testing.replicas import Api, Replica, free_port, status_of
from standin.harness.support import wait_until

pytestmark = [
    pytest.mark.skipif(
        not os.environ.get("DATABASE_URL"), reason="replicas share one PostgreSQL (DATABASE_URL)"
    ),
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]


class RedisServer:
    """``redis-server`` on a free loopback port, no persistence; SIGTERM and wait."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
            + ["--save", "", "--appendonly", "no", "--dir", str(workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self.ping, what="redis-server to answer PING")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as conn:
                conn.sendall(b"PING\r\n")
                return conn.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def replicas(transactional_db: None) -> Iterator[tuple[Replica, Replica]]:
    tmp = Path(tempfile.mkdtemp(prefix="sandman-live-"))
    redis = RedisServer(tmp)
    env = {"SANDMAN_REDIS_URL": redis.url, "SANDMAN_CONTROLLER_AUTOSTART": "false"}
    started = [Replica(name, env, tmp) for name in ("replica-a", "replica-b")]
    try:
        for replica in started:
            wait_until(
                lambda r=replica: status_of(r, "/healthz") == 200,
                what=f"{replica.identity} to serve",
                deadline_s=120,
            )
        yield started[0], started[1]
    finally:
        for replica in started:
            replica.stop()
        redis.stop()


async def pages_see(urls: list[str], cookie: str, act: Any, job_name: str) -> list[dict[str, Any]]:
    """Connect one operator page per URL, run ``act`` (blocking, in a thread) and return
    the ``job.state`` push each page received for the job it created."""
    headers = {"Cookie": f"sessionid={cookie}", "Origin": "http://127.0.0.1"}
    async with aiohttp.ClientSession() as session:
        sockets = [
            await session.ws_connect(url.replace("http", "ws") + "/ws/dashboard/", headers=headers)
            for url in urls
        ]
        job = await asyncio.to_thread(act)

        async def first_push(ws: aiohttp.ClientWebSocketResponse) -> dict[str, Any]:
            while True:
                message = await ws.receive_json(timeout=30)
                if message["kind"] == "job.state" and message["payload"]["job_id"] == job["id"]:
                    return message

        try:
            return list(await asyncio.gather(*(first_push(ws) for ws in sockets)))
        finally:
            for ws in sockets:
                await ws.close()


def test_a_write_on_either_replica_reaches_the_live_pages_of_both(replicas) -> None:
    a, b = replicas
    trainer = get_user_model().objects.create_user(username="trainer")
    api = Api(Token.objects.create(user=trainer).key)
    operator = get_user_model().objects.create_user(username="operator", is_staff=True)
    browser = Client()
    browser.force_login(operator)
    cookie = browser.cookies["sessionid"].value

    for writer, name in ((a, "on-a"), (b, "on-b")):

        def create(writer: Replica = writer, name: str = name) -> dict[str, Any]:
            status, job = api.call(
                writer, "POST", "/api/v1/jobs/", {"name": name, "egress": "allow"}
            )
            assert status == 201, job
            return dict(job)

        pushes = asyncio.run(pages_see([a.url, b.url], cookie, create, name))
        assert [p["payload"]["state"] for p in pushes] == ["active", "active"], (writer, pushes)
