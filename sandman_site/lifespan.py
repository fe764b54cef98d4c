"""The ASGI ``lifespan`` protocol: what a web worker does at its start and at its end.

uvicorn (the production server, README) sends ``lifespan.startup`` before the worker
accepts its first connection, on the loop that will serve its requests, and
``lifespan.shutdown`` after its last; Daphne sends neither, and everything here then
happens lazily, on first use, as before.

* Start: the direct hand-out's connection pool opens (``sandboxes.apis.direct.warm``), so
  the first burst of acquires after a deploy finds its connections instead of waiting
  for the pool to grow while the burst holds both cores; and so does Django's own pool
  (:func:`open_database_pool`), whose first connection the burst's first token and job
  reads otherwise waited for (31 ms inside a burst, against ~4 ms warm: measured per
  request in ``bench/acquire_latency.py``'s first round). Neither waits for the
  database: a worker whose database is down still starts and answers 503s.
* End: that pool and its health checker close (``sandboxes.apis.direct.close``), so the
  worker's PostgreSQL sessions end with it instead of when the server notices the socket.

A failure in any step is logged and the worker goes on: none is needed to serve.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

log = logging.getLogger(__name__)

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


async def lifespan(scope: dict[str, Any], receive: Receive, send: Send) -> None:
    """The ``lifespan`` scope's application (``sandman_site.asgi``'s router)."""
    from sandboxes.apis import direct

    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await _logged(direct.warm(), "the direct hand-out's pool did not open at start")
            await _logged(
                asyncio.to_thread(open_database_pool), "the database pool did not open at start"
            )
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await _logged(direct.close(), "the direct hand-out's pool did not close at shutdown")
            await send({"type": "lifespan.shutdown.complete"})
            return


def open_database_pool(alias: str = DEFAULT_DB_ALIAS) -> bool:
    """Open Django's connection pool of ``alias`` without waiting: the pool's own threads
    make its ``min_size`` connections (``psycopg_pool``'s ``open(wait=False)``; Django
    opens it the same way at a thread's first query, and opening an open pool does
    nothing). False where there is none (SQLite, or ``SANDMAN_DB_POOL_MAX=0``)."""
    pool = getattr(connections[alias], "pool", None)
    if pool is None:
        return False
    pool.open(wait=False)
    return True


async def _logged(step: Awaitable[Any], failed: str) -> None:
    """Run a step the worker does not need to serve (or to end): a failure is logged."""
    try:
        await step
    except Exception:  # noqa: BLE001 - the worker goes on either way
        log.exception(failed)
