"""A web worker's start and end (``sandman_site.lifespan``, the ASGI ``lifespan`` protocol).

uvicorn sends ``lifespan.startup`` before a worker's first connection and
``lifespan.shutdown`` after its last (https://www.uvicorn.org/settings/#implementation,
``--lifespan auto``; the protocol: https://asgi.readthedocs.io/en/latest/specs/lifespan.html).
With the direct hand-out on, a worker opens its claim pool at start, so a burst's first
claims find ``direct.POOL_MIN`` connections instead of waiting for the pool to grow one
connect at a time on the cores the burst needs; at its end it closes them.

* Real uvicorn, two workers, production settings (``SplitService``): before any acquire
  PostgreSQL already shows each worker's ``POOL_MIN`` claim connections.
* The lifespan app on a loop of this test: startup opens the pool, shutdown closes it and
  PostgreSQL's sessions of it end; with the direct hand-out off nothing opens.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.test import override_settings

from sandboxes.apis import direct
from sandboxes.services.offers import database_conninfo
from sandman_site.lifespan import lifespan
from sandman_site.testing.replicas import SplitService, status_of
from standin.harness.support import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        connection.vendor != "postgresql", reason="the direct hand-out is PostgreSQL's"
    ),
]


def claim_sessions() -> int:
    """PostgreSQL's sessions of the claim pools (their ``application_name``), any process."""
    with psycopg.connect(database_conninfo(), autocommit=True) as conn:
        (count,) = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE application_name = %s AND datname = current_database()",
            [direct.APPLICATION_NAME],
        ).fetchone()  # type: ignore[misc]
    return int(count)


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


def test_uvicorn_workers_open_their_claim_pools_before_the_first_acquire() -> None:
    assert claim_sessions() == 0
    tmp = Path(tempfile.mkdtemp(prefix="sandman-lifespan-"))
    service = SplitService({"SANDMAN_DIRECT_HANDOUT": "1"}, tmp, workers=2)
    try:
        wait_until(lambda: status_of(service, "/healthz") == 200, what="the web workers")
        assert len(service.workers()) == 2
        # No acquire was sent: only the workers' start opened these.
        wait_until(
            lambda: claim_sessions() == 2 * direct.POOL_MIN,
            what=f"{direct.POOL_MIN} claim connections per worker",
        )
    finally:
        service.stop()
    wait_until(lambda: claim_sessions() == 0, what="the workers' sessions to end")


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
