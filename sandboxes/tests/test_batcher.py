"""The controller's write batcher (controller/batcher.py): batches form with no timer -- what
queues while one batch is on the executor is the next batch, whatever its kind --, a write
whose waiter was cancelled before its batch left is dropped, and each write gets its own
outcome."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from sandboxes.controller.batcher import WriteBatcher
from sandman_site.errors import ControllerUnavailable, InvalidTransition

pytestmark = pytest.mark.asyncio


class GatedDb:
    """Stands in for the database executor: records each batch, answers when released."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.kinds: list[list[str]] = []
        self.gate = asyncio.Event()

    async def run(self, fn: Any, groups: list[tuple[Any, list[Any]]], *, priority: int) -> Any:
        self.batches.append([i for _, items in groups for i in items])
        self.kinds.append([apply.__name__ for apply, _ in groups])
        await self.gate.wait()
        return {
            apply: [InvalidTransition(f"refused {i}") if i == "bad" else f"row {i}" for i in items]
            for apply, items in groups
        }


def _move(item: str) -> Any:
    return item  # the batcher passes items through to the service untouched


async def test_writes_queued_while_a_batch_is_out_form_the_next_batch_and_cancelled_ones_drop():
    db = GatedDb()
    batcher = WriteBatcher(types.SimpleNamespace(db=db))
    first = asyncio.create_task(batcher.move(_move("a")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert db.batches == [["a"]]  # a lone write goes at once
    queued = [asyncio.create_task(batcher.move(_move(x))) for x in ("b", "c", "bad")]
    await asyncio.sleep(0)
    queued[1].cancel()  # "c" gives up before its batch leaves
    await asyncio.sleep(0)
    db.gate.set()
    assert await first == "row a"
    assert await queued[0] == "row b"
    with pytest.raises(InvalidTransition):
        await queued[2]  # refused alone; "b" of the same batch still answered
    with pytest.raises(asyncio.CancelledError):
        await queued[1]
    assert db.batches == [["a"], ["b", "bad"]]
    assert (batcher.batches, batcher.writes, batcher.largest) == (2, 3, 2)


async def test_urgent_writes_have_their_own_lane_and_never_wait_behind_a_background_batch():
    db = GatedDb()
    batcher = WriteBatcher(types.SimpleNamespace(db=db))
    background = asyncio.create_task(batcher.move(_move("bg")))
    await asyncio.sleep(0)
    urgent = asyncio.create_task(batcher.move(_move("now"), urgent=True))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert db.batches == [["bg"], ["now"]]  # both out at once, each in its lane
    db.gate.set()
    assert (await background, await urgent) == ("row bg", "row now")


async def test_writes_of_every_kind_queued_meanwhile_leave_in_one_batch_each_kind_in_order():
    """One lane per priority: a create's row, a move and an acquisition's finish queued while
    a batch is out share the next batch (one executor call, one transaction)."""
    db = GatedDb()
    batcher = WriteBatcher(types.SimpleNamespace(db=db))
    first = asyncio.create_task(batcher.move(_move("a")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    queued = [
        asyncio.create_task(batcher.move(_move("b"))),
        asyncio.create_task(batcher.request(_move("r"))),  # type: ignore[arg-type]
        asyncio.create_task(batcher.move(_move("c"))),
        asyncio.create_task(batcher.acquisition(_move("q"))),  # type: ignore[arg-type]
    ]
    await asyncio.sleep(0)
    db.gate.set()
    assert await first == "row a"
    assert [await q for q in queued] == ["row b", "row r", "row c", None]
    assert db.batches == [["a"], ["b", "c", "r", "q"]]
    assert db.kinds[1] == ["_apply_moves", "_apply_requests", "_apply_acquisitions"]
    assert (batcher.batches, batcher.writes) == (2, 5)


async def test_close_waits_for_the_batch_in_flight_and_what_queued_behind_it_then_refuses():
    """At the controller's shutdown the batches already on the executor end before the loop
    stops: no flush task is left pending (asyncio would destroy it mid-batch), and a write a
    live waiter still wants is sent rather than forgotten. A later write is refused."""
    db = GatedDb()
    batcher = WriteBatcher(types.SimpleNamespace(db=db))
    first = asyncio.create_task(batcher.move(_move("a")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    behind = asyncio.create_task(batcher.move(_move("b")))
    await asyncio.sleep(0)
    closing = asyncio.create_task(batcher.close())
    await asyncio.sleep(0)
    assert not closing.done()  # "a" is still on the executor
    with pytest.raises(ControllerUnavailable):
        await batcher.move(_move("late"))
    db.gate.set()
    await closing
    assert (await first, await behind) == ("row a", "row b")
    assert db.batches == [["a"], ["b"]]
    assert not batcher._flushes


async def test_close_cancels_a_batch_that_outlasts_its_timeout_and_its_waiters():
    db = GatedDb()  # the gate never opens: a database that does not answer
    batcher = WriteBatcher(types.SimpleNamespace(db=db))
    stuck = asyncio.create_task(batcher.move(_move("a")))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    await batcher.close(timeout=0)
    with pytest.raises(asyncio.CancelledError):
        await stuck
    assert not batcher._flushes
