"""``Idempotency-Key`` on the hot routes: a retried acquire gets the same sandbox, a
retried release is a no-op (issue 14, item 7).

A client that lost the answer (a keep-alive connection the server closed, a proxy that
cut the socket) cannot know whether a sandbox was handed out; it resends with the same
key. Per (route, scope, key):

* while the first call still runs in this process, the retry waits for ITS answer;
* otherwise a recorded answer is replayed (``selectors.idempotent_answer``; an acquire's
  token comes from the sandbox row, records hold none), read in the same request-thread
  hop as the acquire's restart recovery (``before``);
* otherwise the call runs once, shielded from the request's cancellation from the read
  on (a client that disconnects must not leave a sandbox handed out with no record, nor a
  key whose waiters never hear; one that leaves during the read still gets its call run
  and recorded, for its resend), and its answer is
  recorded before anyone gets it -- unless the database is lost between the call's commit
  and the record: then the answer goes out unrecorded (never a 503 for a sandbox that was
  handed out).

Invariant: a key is 1-200 printable ASCII characters (else 400 ``invalid``); calls that
fail record nothing (a retry runs again: the failure handed nothing out). The in-flight
map is per process - replicas share only the recorded answers.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.utils import timezone
from rest_framework.request import Request

from sandboxes import selectors
from sandboxes.services.idempotency import idempotent_call_record
from sandman_site.dbguard import OUTAGE_ERRORS
from sandman_site.errors import InvalidInput

log = logging.getLogger(__name__)

HEADER = "Idempotency-Key"

# Calls in flight in this process. concurrent.futures (not asyncio) futures: a retry may
# run on another event loop than the first call (Django under WSGI runs one per request).
_running: dict[tuple[str, int, str], concurrent.futures.Future[dict[str, Any]]] = {}
_running_lock = threading.Lock()


def header_key(request: Request) -> str | None:
    """The request's key, None without one; 400 for a malformed one."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not valid_key(key):
        raise InvalidInput(f"{HEADER} must be 1-200 printable ASCII characters without spaces")
    return key


def valid_key(key: str) -> bool:
    return 1 <= len(key) <= 200 and all(33 <= ord(c) < 127 for c in key)


async def run_once(
    *,
    route: str,
    scope: int,
    key: str,
    call: Callable[[Any], Awaitable[dict[str, Any]]],
    sandbox_of: Callable[[dict[str, Any]], int | None],
    before: Callable[[], Any] | None = None,
    fast: Callable[[], Awaitable[dict[str, Any] | None]] | None = None,
) -> dict[str, Any]:
    """``call``'s answer, run at most once per key (see the module docstring).

    ``before`` (an acquire's restart recovery: a read, and a claim if it finds one) runs
    in the SAME request-thread hop as the recorded answer's read, only if nothing is
    recorded; ``call`` gets its result (None without one). One hop fewer per keyed call: each
    ``sync_to_async`` is a hand-off to the worker's one request thread and back.

    ``fast`` (a direct claim: the key's history read and its answer recorded in the
    hand-out's own transaction, no request-thread hop) runs first; its answer is final
    and already recorded; None sends the call the usual way (read, call, record)."""
    slot = (route, scope, key)
    with _running_lock:
        running = _running.get(slot)
        if running is None:
            mine: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()
            _running[slot] = mine
    if running is not None:  # the first call with this key still runs here: its answer
        return await asyncio.wrap_future(running)

    def read() -> tuple[dict[str, Any] | None, Any]:
        recorded = selectors.idempotent_answer(route=route, scope=scope, key=key)
        if recorded is not None or before is None:
            return recorded, None
        return None, before()

    async def once() -> dict[str, Any]:
        try:
            answer = None if fast is None else await fast()  # recorded with its effect
            if answer is None:
                recorded, prior = await sync_to_async(read)()
                if recorded is not None:
                    answer = recorded
                else:
                    answer = await call(prior)
                    await _record(route, scope, key, answer, sandbox_of(answer))
        except BaseException as exc:
            mine.set_exception(exc)
            raise
        else:
            mine.set_result(answer)
            return answer
        finally:
            with _running_lock:
                _running.pop(slot, None)

    return await asyncio.shield(asyncio.ensure_future(once()))


def recorded_form(answer: dict[str, Any]) -> dict[str, Any]:
    """What is recorded of an answer: all but the token (a replay reads it from the row)."""
    return {k: v for k, v in answer.items() if k != "token"}


async def _record(
    route: str, scope: int, key: str, answer: dict[str, Any], sandbox_id: int | None
) -> None:
    public = recorded_form(answer)
    try:
        await sync_to_async(idempotent_call_record)(
            route=route,
            scope=scope,
            key=key,
            answer=public,
            sandbox_id=sandbox_id,
            now=timezone.now(),
        )
    except OUTAGE_ERRORS:
        # The call committed (a sandbox is handed out): a 503 would say nothing changed.
        # The answer goes out unrecorded; only a retry of an answer the client did get
        # could then run again.
        log.warning("%s %s: answer not recorded, database lost", route, scope)
