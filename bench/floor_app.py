"""The floor of the REST hot path: a bare ASGI app for ``bench/hot_path_floor.py``.

Not Sandman. It answers the two hot routes with the least work any design must do, so the
bench can tell how much of Sandman's acquire+release time is the design and how much the
machine, the HTTP stack and PostgreSQL:

* ``FLOOR_MODE=http``: parse the request (token, JSON body), answer a constant sandbox.
  No database. The floor of uvicorn, httptools, uvloop and the aiohttp load generator.
* ``FLOOR_MODE=pg``: the same, and the acquire is ONE statement on PostgreSQL that hands
  out the oldest warm pod of the key (``FOR UPDATE SKIP LOCKED``) and inserts its
  acquisition and its event in the same statement (data-modifying CTEs: one round trip,
  atomic); the release is one statement that puts the pod back and writes its event. The
  floor of any design that records each hand-out in PostgreSQL before it answers.
* ``FLOOR_MODE=pg_health``: ``pg``, and before the hand-out a ``GET /health`` of one real
  execd (``FLOOR_EXECD``) over a kept-alive connection: Sandman's health check of a warm
  pod before it is handed out.

What it leaves out, each of which Sandman does: a replacement create after each hand-out
(the pool refills here by the release putting the pod back), the release's delete, the
keyed record, per-job caps and pacing, the token's database read on a miss.
Run only by the bench, under uvicorn: ``uvicorn floor_app:app --app-dir bench``.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

ACQUIRE = re.compile(r"^/api/v1/jobs/(\d+)/acquire/$")
RELEASE = re.compile(r"^/api/v1/sandboxes/(\d+)/release/$")

HAND_OUT = """
WITH taken AS (
    UPDATE floor_pod SET state = 'in_use', handed_at = now()
    WHERE id = (
        SELECT id FROM floor_pod
        WHERE job_id = %(job)s AND pool_key = %(key)s AND state = 'warm'
        ORDER BY warm_since, id LIMIT 1 FOR UPDATE SKIP LOCKED
    )
    RETURNING id, address, token
), acquisition AS (
    INSERT INTO floor_acquisition (job_id, sandbox_id, state, source, started_at, finished_at)
    SELECT %(job)s, id, 'ok', 'warm', now(), now() FROM taken
), event AS (
    INSERT INTO floor_event (sandbox_id, kind, at) SELECT id, 'handed_out', now() FROM taken
)
SELECT id, address, token FROM taken
"""

PUT_BACK = """
WITH back AS (
    UPDATE floor_pod SET state = 'warm', warm_since = now()
    WHERE id = %(id)s AND state = 'in_use'
    RETURNING id
), event AS (
    INSERT INTO floor_event (sandbox_id, kind, at) SELECT id, 'released', now() FROM back
)
SELECT id FROM back
"""


class Floor:
    """One worker's state: its mode, its token, its pool of connections, its execd client."""

    def __init__(self) -> None:
        self.mode = os.environ["FLOOR_MODE"]
        self.token = f"Token {os.environ['FLOOR_TOKEN']}".encode()
        self.db: Any = None
        self.http: Any = None

    async def start(self) -> None:
        if self.mode.startswith("pg"):
            from psycopg_pool import AsyncConnectionPool

            url = os.environ["DATABASE_URL"]
            self.db = AsyncConnectionPool(url, min_size=8, max_size=32, open=False)
            await self.db.open(wait=True)
        if self.mode == "pg_health":
            import aiohttp

            self.http = aiohttp.ClientSession(os.environ["FLOOR_EXECD"])

    async def stop(self) -> None:
        if self.db is not None:
            await self.db.close()
        if self.http is not None:
            await self.http.close()

    async def acquire(self, job: int, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if not isinstance(body.get("image"), str) or not isinstance(body.get("spec"), dict):
            return 400, {"error": "invalid", "detail": "image and spec are required"}
        key = json.dumps([body["image"], body["spec"], body.get("role", "rollout")])
        if self.mode == "http":
            return 200, answer(1, "127.0.0.1:1", "t" * 64)
        if self.http is not None:
            async with self.http.get("/health") as r:
                health = await r.json()
            if not health.get("ok"):
                return 503, {"error": "unhealthy", "detail": "the execd did not answer ok"}
        async with self.db.connection() as conn:
            row = await (await conn.execute(HAND_OUT, {"job": job, "key": key})).fetchone()
        if row is None:
            return 504, {"error": "acquire_timeout", "detail": "no warm pod"}
        return 200, answer(*row)

    async def release(self, sandbox: int) -> tuple[int, dict[str, Any]]:
        if self.mode == "http":
            return 200, {"sandbox_id": sandbox, "state": "released"}
        async with self.db.connection() as conn:
            row = await (await conn.execute(PUT_BACK, {"id": sandbox})).fetchone()
        if row is None:
            return 409, {"error": "not_in_use", "detail": "that sandbox is not in use"}
        return 200, {"sandbox_id": sandbox, "state": "released"}


def answer(sandbox: int, address: str, token: str) -> dict[str, Any]:
    return {
        "sandbox_id": sandbox,
        "address": address,
        "token": token,
        "source": "warm",
        "wait_ms": 0.0,
        "queue_ms": 0.0,
    }


FLOOR = Floor()


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await FLOOR.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await FLOOR.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    headers = dict(scope["headers"])
    path = scope["path"]
    if headers.get(b"authorization") != FLOOR.token:
        status, data = 401, {"error": "not_authenticated", "detail": "no such token"}
    elif (m := ACQUIRE.match(path)) and scope["method"] == "POST":
        status, data = await FLOOR.acquire(int(m.group(1)), json.loads(body or b"{}"))
    elif (m := RELEASE.match(path)) and scope["method"] == "POST":
        status, data = await FLOOR.release(int(m.group(1)))
    else:
        status, data = 404, {"error": "not_found", "detail": path}
    payload = json.dumps(data).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": payload})
