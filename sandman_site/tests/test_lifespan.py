"""A web worker's start and end (``sandman_site.lifespan``, the ASGI ``lifespan`` protocol).

uvicorn sends ``lifespan.startup`` before a worker's first connection and
``lifespan.shutdown`` after its last (https://www.uvicorn.org/settings/#implementation,
``--lifespan auto``; the protocol: https://asgi.readthedocs.io/en/latest/specs/lifespan.html).
With the direct hand-out on, a worker opens its claim pool at start, so a burst's first
claims find ``direct.POOL_MIN`` connections instead of waiting for the pool to grow one
connect at a time on the cores the burst needs; at its end it closes them. It opens
Django's own pool at start too (``open_database_pool``), for the requests' token and job
reads.

* Real uvicorn, two workers, production settings (``SplitService``): before any request
  PostgreSQL already shows each worker's ``POOL_MIN`` claim connections and its Django
  pool's ``min_size`` (each worker's sessions found by its sockets' ports).
* ``open_database_pool`` on an alias of its own: it opens without waiting; no pool is
  no error.
* The lifespan app on a loop of this test: startup opens the pool, shutdown closes it and
  PostgreSQL's sessions of it end; with the direct hand-out off nothing opens.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection, connections
from django.test import override_settings

from sandboxes.apis import direct
from sandboxes.services.offers import database_conninfo
from sandman_site.lifespan import lifespan, open_database_pool
from sandman_site.testing.replicas import SplitService, status_of
from standin.harness.support import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the direct hand-out is PostgreSQL's"
    ),
]


def sessions(where: str, params: list[Any]) -> int:
    """PostgreSQL's sessions of this database (``pg_stat_activity``) that ``where`` keeps."""
    with psycopg.connect(database_conninfo(), autocommit=True) as conn:
        (count,) = conn.execute(
            f"SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND {where}",
            params,
        ).fetchone()  # type: ignore[misc]
    return int(count)


def claim_sessions() -> int:
    """PostgreSQL's sessions of the claim pools (their ``application_name``), any process."""
    return sessions("application_name = %s", [direct.APPLICATION_NAME])


async def drive(messages: list[str], between: Any = None) -> list[str]:
    """Run ``lifespan`` through ``messages`` (the server's), calling ``between`` (async)
    after the startup's answer; the app's answers' types."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    answers: list[str] = []

    async def send(message: dict[str, Any]) -> None:
        answers.append(message["type"])
        if message["type"] == "lifespan.startup.complete" and between is not None:
            await between()

    for kind in messages:
        inbox.put_nowait({"type": kind})
    await lifespan({"type": "lifespan", "asgi": {"version": "3.0"}}, inbox.get, send)
    return answers


def _socket_ports(pid: int) -> set[int]:
    """The local ports of ``pid``'s TCP sockets: its descriptors' socket inodes, looked up
    in the TCP tables of its network namespace (``proc(5)``: ``/proc/<pid>/net/tcp``)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
                fields = line.split()
                if fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def django_sessions(pid: int) -> int:
    """PostgreSQL's sessions of one web worker that are not its claim pool's: Django's."""
    return sessions(
        "client_port = ANY(%s) AND application_name <> %s",
        [sorted(_socket_ports(pid)), direct.APPLICATION_NAME],
    )


def test_uvicorn_workers_open_their_pools_before_the_first_request() -> None:
    """No request at all is sent until both pools of both workers are open: the claim
    pool's ``POOL_MIN`` connections and Django's pool's ``min_size``
    (``SANDMAN_DB_POOL_MIN``)."""
    assert claim_sessions() == 0
    minimum = 2
    tmp = Path(tempfile.mkdtemp(prefix="sandman-lifespan-"))
    env = {"SANDMAN_DIRECT_HANDOUT": "1", "SANDMAN_DB_POOL_MIN": str(minimum)}
    service = SplitService(env, tmp, workers=2)
    try:
        # Only the workers' start opened these (their lifespan).
        wait_until(
            lambda: claim_sessions() == 2 * direct.POOL_MIN,
            what=f"{direct.POOL_MIN} claim connections per worker",
        )
        workers = service.workers()
        assert len(workers) == 2
        wait_until(
            lambda: [django_sessions(pid) for pid in workers] == [minimum, minimum],
            what=f"{minimum} Django connections per worker",
        )
        assert status_of(service, "/healthz") == 200
    finally:
        service.stop()
    wait_until(lambda: claim_sessions() == 0, what="the workers' sessions to end")


def test_a_database_pool_opens_without_waiting_and_none_is_no_error() -> None:
    """``open_database_pool`` on an alias of its own (this database, its own
    ``application_name``): it returns at once, and the pool's threads make its
    ``min_size`` connections; an alias without a pool answers False."""
    alias, name = "lifespan-warm", "sandman-lifespan-test"
    own = dict(connection.settings_dict)
    own["OPTIONS"] = {**own["OPTIONS"], "application_name": name}
    unpooled = dict(connection.settings_dict)
    unpooled["OPTIONS"] = {k: v for k, v in own["OPTIONS"].items() if k != "pool"}
    connections.settings[alias] = own
    connections.settings[f"{alias}-unpooled"] = unpooled

    def named() -> int:
        return sessions("application_name = %s", [name])

    try:
        assert named() == 0
        assert open_database_pool(alias) is True
        minimum = own["OPTIONS"]["pool"]["min_size"]
        wait_until(lambda: named() == minimum, what=f"the pool's {minimum} connections")
        assert open_database_pool(alias) is True  # an open pool: nothing more
        assert open_database_pool(f"{alias}-unpooled") is False
        assert named() == minimum
    finally:
        connections[alias].close_pool()
        for one in (alias, f"{alias}-unpooled"):
            del connections[one]
            del connections.settings[one]
    wait_until(lambda: named() == 0, what="the pool's sessions to end")


def test_startup_opens_the_pool_and_shutdown_closes_it() -> None:
    seen: dict[str, Any] = {}

    async def started() -> None:
        handles = direct._loops[asyncio.get_running_loop()]
        pool = await handles.pool()
        await pool.wait(timeout=30)  # its POOL_MIN connections are open
        seen["sessions"] = await asyncio.to_thread(claim_sessions)
        seen["handles"] = handles

    async def run() -> list[str]:
        answers = await drive(["lifespan.startup", "lifespan.shutdown"], started)
        seen["left"] = asyncio.get_running_loop() in direct._loops
        return answers

    with override_settings(SANDMAN_DIRECT_HANDOUT=True):
        answers = asyncio.run(run())
    assert answers == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert seen["sessions"] == direct.POOL_MIN
    assert seen["handles"]._pool.closed and not seen["left"]
    wait_until(lambda: claim_sessions() == 0, what="the pool's sessions to end")


def test_with_the_direct_hand_out_off_nothing_opens() -> None:
    async def started() -> None:
        assert asyncio.get_running_loop() not in direct._loops

    with override_settings(SANDMAN_DIRECT_HANDOUT=False):
        answers = asyncio.run(drive(["lifespan.startup", "lifespan.shutdown"], started))
    assert answers == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert claim_sessions() == 0
