"""The controller's write batcher (controller/batcher.py): batches form with no timer -- what
queues while one batch is on the executor is the next batch --, a write whose waiter was
cancelled before its batch left is dropped, and each write gets its own outcome."""

from __future__ import annotations

import asyncio
import types
from typing import Any

import pytest

from sandboxes.controller.batcher import WriteBatcher
from sandman_site.errors import InvalidTransition

pytestmark = pytest.mark.asyncio


class GatedDb:
    """Stands in for the database executor: records each batch, answers when released."""

    def __init__(self) -> None:
        self.batches: list[list[Any]] = []
        self.gate = asyncio.Event()

    async def run(self, fn: Any, items: list[Any], *, priority: int) -> list[Any]:
        self.batches.append(list(items))
        await self.gate.wait()
        return [InvalidTransition(f"refused {i}") if i == "bad" else f"row {i}" for i in items]


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
