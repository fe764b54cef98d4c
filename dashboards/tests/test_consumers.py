"""The dashboard websocket and ``sandman_site.live.publish`` through the real in-memory layer.

A page is a ``WebsocketCommunicator`` on ``/ws/dashboard/`` (the app's own URL routes);
publishers run where the real ones do: the consumer's loop, a plain worker thread, a
thread that runs its own asyncio loop (the controller's), and a transaction's commit.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
from asgiref.sync import async_to_sync, sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.db import connections, transaction

from dashboards.consumers import CLOSE_FORBIDDEN
from dashboards.routing import websocket_urlpatterns
from sandman_site import live

STAFF = SimpleNamespace(is_authenticated=True, is_active=True, is_staff=True)
TRAINER = SimpleNamespace(is_authenticated=True, is_active=True, is_staff=False)
RETIRED_STAFF = SimpleNamespace(is_authenticated=True, is_active=False, is_staff=True)

# Channels closes stale DB connections around every consumer message: DB access allowed.
pytestmark = [pytest.mark.asyncio, pytest.mark.django_db]


@pytest_asyncio.fixture(autouse=True)
async def cleanup() -> AsyncIterator[None]:
    yield
    live.shutdown()
    # Channels touches the DB around every consumer message from asgiref's one
    # sync thread; close that thread's connection so the test database can be dropped.
    await sync_to_async(connections.close_all)()


def _page(user: Any) -> WebsocketCommunicator:
    router = URLRouter(websocket_urlpatterns)

    async def as_user(scope: dict, receive: Any, send: Any) -> None:
        await router({**scope, "user": user}, receive, send)

    return WebsocketCommunicator(as_user, "/ws/dashboard/")


async def _connected_page() -> WebsocketCommunicator:
    page = _page(STAFF)
    connected, _ = await page.connect()
    assert connected
    return page


async def test_a_staff_page_receives_an_event_published_on_its_own_loop() -> None:
    page = await _connected_page()
    ready_at = dt.datetime(2026, 10, 14, 12, 0, 5, tzinfo=dt.UTC)
    sent = live.publish("sandbox.state", {"sandbox_id": 7, "state": "ready", "at": ready_at})
    message = await page.receive_json_from(timeout=10)
    assert message == {
        "kind": "sandbox.state",
        "payload": {"sandbox_id": 7, "state": "ready", "at": "2026-10-14T12:00:05Z"},
    }
    assert sent.result(timeout=10) is None
    await page.disconnect()


async def test_an_event_published_from_a_thread_running_its_own_loop_reaches_the_page() -> None:
    """The controller's loop thread: async_to_sync refuses to run there, publish must not."""
    page = await _connected_page()
    seen: dict[str, Any] = {}

    def controller_thread() -> None:
        async def main() -> None:
            try:
                async_to_sync(asyncio.sleep)(0)
            except RuntimeError as exc:
                seen["async_to_sync"] = exc
            seen["future"] = live.publish("acquisition", {"acquisition_id": 3, "outcome": "ok"})

        asyncio.run(main())

    await asyncio.to_thread(controller_thread)
    assert isinstance(seen["async_to_sync"], RuntimeError)
    message = await page.receive_json_from(timeout=10)
    assert message == {"kind": "acquisition", "payload": {"acquisition_id": 3, "outcome": "ok"}}
    await asyncio.wrap_future(seen["future"])
    await page.disconnect()


async def test_events_from_a_plain_worker_thread_arrive_in_order() -> None:
    page = await _connected_page()

    def worker() -> None:
        for i in range(5):
            live.publish("sandbox.state", {"sandbox_id": i, "state": "requested"})

    thread = threading.Thread(target=worker)
    thread.start()
    await asyncio.to_thread(thread.join)
    ids = [(await page.receive_json_from(timeout=10))["payload"]["sandbox_id"] for _ in range(5)]
    assert ids == [0, 1, 2, 3, 4]
    await page.disconnect()


@pytest.mark.parametrize(
    "user",
    [AnonymousUser(), TRAINER, RETIRED_STAFF, None],
    ids=["anonymous", "trainer", "inactive staff", "no user"],
)
async def test_a_socket_without_a_staff_user_is_refused(user: Any) -> None:
    page = _page(user)
    connected, code = await page.connect()
    assert (connected, code) == (False, CLOSE_FORBIDDEN)


@pytest.mark.django_db(transaction=True)
async def test_publish_inside_a_transaction_waits_for_commit_and_a_rollback_drops_it() -> None:
    page = await _connected_page()
    futures: dict[str, Any] = {}

    class Rollback(Exception):
        pass

    def write(name: str, commit: bool) -> None:
        try:
            with transaction.atomic():
                futures[name] = live.publish("sandbox.state", {"sandbox_id": name})
                futures[f"{name}-inside"] = futures[name].done()
                if not commit:
                    raise Rollback
        except Rollback:
            pass

    await sync_to_async(write)("rolled-back", False)
    await sync_to_async(write)("committed", True)
    message = await page.receive_json_from(timeout=10)
    # The first and only event the page sees is the committed one.
    assert message["payload"] == {"sandbox_id": "committed"}
    assert futures["committed-inside"] is False and futures["rolled-back-inside"] is False
    await asyncio.wrap_future(futures["committed"])
    assert not futures["rolled-back"].done()
    await page.disconnect()


async def test_a_broken_payload_is_reported_on_the_future_and_never_raised() -> None:
    sent = live.publish("sandbox.state", {"not json": object()})
    assert isinstance(sent.exception(timeout=10), TypeError)


async def test_with_no_page_connected_a_publish_still_completes_through_the_dispatcher() -> None:
    page = await _connected_page()
    await page.disconnect()
    sent = live.publish("job.state", {"job_id": 1, "state": "draining"})
    await asyncio.wrap_future(sent)  # raises the publish's error, if any
    assert sent.done() and sent.exception() is None
