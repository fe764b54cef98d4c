"""Live push to the operator pages: services call ``publish`` after their transaction commits.

A neutral module: the services of every app (``sandboxes.services``, ``incidents.services``)
publish through it, and the websocket consumer that delivers (``dashboards.consumers``)
registers its loop here, so no app's services import the dashboards app and the dashboards
never import service internals. Keep it free of app imports (Django and Channels only).

``publish(kind, payload)`` sends one ``dashboard.event`` message to the Channels group
``dashboard`` (:data:`GROUP`); :class:`dashboards.consumers.DashboardConsumer` forwards it
to every connected operator page as ``{"kind": ..., "payload": ...}``.

Kinds the dashboard reads (``static/sandman/dashboard.js``; any other kind is forwarded and
ignored by the page). Extra keys are welcome; the ones marked * are what the page uses:

* ``"sandbox.state"`` (alias ``"sandbox"``), on every sandbox state change:
  ``{sandbox_id*, job_id, name, state*, previous*, role, source, key_hash, image, at}``.
  ``state == "requested"`` (or ``previous == ""``) refreshes creates per second;
  ``state == "ready"`` refreshes the create-to-Ready charts; every one refreshes the
  live-by-state bar.
* ``"acquisition"``, on every finished acquisition:
  ``{acquisition_id*, job_id*, sandbox_id, outcome*, source*, role, key_hash, queue_ms,
  create_ms, wait_ms, at}``: refreshes the acquisition-wait and warm-hit charts.
* ``"job.state"``: ``{job_id*, state*, at}``: refreshes the warm-hit chart (job names).
* ``"sandbox.event"``: timeline entries; forwarded, not charted yet.
* ``"grading.state"``, when a grading reaches its verdict: ``{grading_id*, job_id*,
  verdict*, at}``: refreshes the charts of ``/gradings/``.
* ``"trajectories"`` and ``"learner_steps"``, after a trainer batch stored records:
  ``{job_id, stored, at}``: refresh every chart of ``/training/``.

Payloads are made JSON-plain here (datetimes become ISO 8601 strings), so a Redis layer's
msgpack and the browser's JSON both accept them, and the caller's dict is never shared.

Delivery rules a reader must not break:

* **Any thread.** Request threads, worker threads and threads that RUN an asyncio loop (the
  controller's loop thread, where ``async_to_sync`` raises) may all call ``publish``.
* **The consumers' loop.** The in-memory channel layer (the embedded default) keeps one
  ``asyncio.Queue`` per consumer, owned by the loop that consumer runs on; putting into it
  from another loop or thread does not wake that loop. So while consumers are connected in
  this process the send is scheduled ON their loop (``run_coroutine_threadsafe``, which
  never blocks, also from that loop's own thread). With no consumer in this process (a
  worker publishing through Redis) it goes to one small dispatcher thread with its own
  loop, started on first use and stopped by :func:`shutdown`; with no consumer and the
  in-memory layer nobody can receive it, and the publish completes at once.
* **Never raises, never blocks.** ``publish`` returns a ``concurrent.futures.Future`` that
  completes once the layer took the message, or carries the error (which is logged, at most
  one warning per ``_WARN_EVERY_S``). A dashboard that cannot be reached must not fail an
  acquire.
* **After commit.** Called inside ``transaction.atomic()``, the send waits for the commit
  (``on_commit``); a rollback drops it and the future stays pending. Services may still
  wrap the call in ``transaction.on_commit`` themselves; that is harmless.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import threading
import time
from typing import Any

from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction

log = logging.getLogger(__name__)

GROUP = "dashboard"
EVENT_TYPE = "dashboard.event"
_WARN_EVERY_S = 30.0

_lock = threading.Lock()
# Loops that have at least one DashboardConsumer connected, newest last, with counts.
_listener_loops: dict[asyncio.AbstractEventLoop, int] = {}
_dispatcher: _Dispatcher | None = None
_last_warning = 0.0
_suppressed = 0


class _Dispatcher:
    """One daemon thread running an event loop, for publishes no consumer loop can take."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="sandman-live-dispatch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def stop(self, timeout_s: float) -> None:
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout_s)


def listener_joined(loop: asyncio.AbstractEventLoop) -> None:
    """A consumer on ``loop`` joined the group: deliver there from now on."""
    with _lock:
        count = _listener_loops.pop(loop, 0)
        _listener_loops[loop] = count + 1  # re-inserted: newest last


def listener_left(loop: asyncio.AbstractEventLoop) -> None:
    with _lock:
        count = _listener_loops.get(loop, 0) - 1
        if count > 0:
            _listener_loops[loop] = count
        else:
            _listener_loops.pop(loop, None)


def _listener_loop() -> asyncio.AbstractEventLoop | None:
    """The newest loop with consumers that is still running (closed ones are forgotten)."""
    with _lock:
        for loop in reversed(list(_listener_loops)):
            if loop.is_closed():
                del _listener_loops[loop]
            elif loop.is_running():
                return loop
    return None


def _dispatcher_loop() -> asyncio.AbstractEventLoop:
    global _dispatcher
    with _lock:
        if _dispatcher is None or _dispatcher.loop.is_closed():
            _dispatcher = _Dispatcher()
        return _dispatcher.loop


def shutdown(timeout_s: float = 5.0) -> None:
    """Stop the dispatcher thread if it runs (tests, process exit). Publishing restarts it."""
    global _dispatcher
    with _lock:
        dispatcher, _dispatcher = _dispatcher, None
    if dispatcher is not None:
        dispatcher.stop(timeout_s)


def _warn(kind: str, exc: BaseException) -> None:
    global _last_warning, _suppressed
    now = time.monotonic()
    with _lock:
        if now - _last_warning < _WARN_EVERY_S and _last_warning:
            _suppressed += 1
            return
        _last_warning, suppressed, _suppressed = now, _suppressed, 0
    log.warning(
        "live publish of %r failed (%d similar failures suppressed)",
        kind,
        suppressed,
        exc_info=(type(exc), exc, exc.__traceback__),
    )


async def _send(message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is not None:
        await layer.group_send(GROUP, message)


def _dispatch(message: dict[str, Any], done: concurrent.futures.Future[None]) -> None:
    kind = message["kind"]

    def settle(fut: concurrent.futures.Future[None]) -> None:
        exc = fut.exception() if not fut.cancelled() else None
        if fut.cancelled():
            done.cancel()
        elif exc is not None:
            _warn(kind, exc)
            done.set_exception(exc)
        else:
            done.set_result(None)

    if _listener_loop() is None and isinstance(get_channel_layer(), InMemoryChannelLayer):
        # An in-memory layer's groups live in this process: with no consumer here nobody
        # can receive it. Skipping the dispatcher's loop hop costs a burst nothing.
        done.set_result(None)
        return
    for attempt in range(2):
        loop = _listener_loop() if attempt == 0 else _dispatcher_loop()
        if loop is None:
            continue
        try:
            sent = asyncio.run_coroutine_threadsafe(_send(message), loop)
        except RuntimeError:  # the loop closed between the check and the call
            continue
        sent.add_done_callback(settle)
        return
    raise RuntimeError("no event loop could take the message")


def publish(kind: str, payload: dict[str, Any]) -> concurrent.futures.Future[None]:
    """Send ``{kind, payload}`` to every dashboard; never raises, never blocks."""
    done: concurrent.futures.Future[None] = concurrent.futures.Future()
    try:
        message = {
            "type": EVENT_TYPE,
            "kind": str(kind),
            "payload": json.loads(json.dumps(payload, cls=DjangoJSONEncoder)),
        }
        connection = transaction.get_connection()
        if connection.in_atomic_block:
            connection.on_commit(lambda: _dispatch_logged(message, done))
        else:
            _dispatch(message, done)
    except Exception as exc:  # noqa: BLE001 - by contract a publish never fails its caller
        _warn(str(kind), exc)
        if not done.done():
            done.set_exception(exc)
    return done


def _dispatch_logged(message: dict[str, Any], done: concurrent.futures.Future[None]) -> None:
    try:
        _dispatch(message, done)
    except Exception as exc:  # noqa: BLE001 - runs inside on_commit; must not break the commit
        _warn(message["kind"], exc)
        if not done.done():
            done.set_exception(exc)
