"""Hand-outs first: urgent database calls overtake background ones, and warm builds and
release deletes wait while acquires are in flight (bounded)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from sandboxes.controller.dbexec import BACKGROUND, URGENT, DbExecutor
from sandboxes.controller.tasks import AcquireGate


def test_an_urgent_call_runs_before_background_calls_queued_ahead_of_it() -> None:
    """A hand-out queued behind a burst of replacement creates' writes goes first."""
    executor = DbExecutor(workers=1)
    gate = threading.Event()
    started = threading.Event()
    order: list[str] = []

    def hold() -> None:
        started.set()
        gate.wait(30)

    try:
        busy = executor.submit(hold)
        assert started.wait(30)  # the only worker is busy now; the rest queue up
        calls = [executor.submit(order.append, f"background-{i}") for i in range(3)]
        calls.append(executor.submit(order.append, "urgent", priority=URGENT))
        calls.append(executor.submit(order.append, "background-3", priority=BACKGROUND))
        gate.set()
        for call in [busy, *calls]:
            call.result(timeout=30)
    finally:
        gate.set()
        executor.close()
    assert order == ["urgent", "background-0", "background-1", "background-2", "background-3"]


@pytest.mark.asyncio
async def test_an_error_reaches_the_caller_and_the_worker_keeps_serving() -> None:
    executor = DbExecutor(workers=1)
    try:
        with pytest.raises(ZeroDivisionError):
            await executor.run(lambda: 1 / 0)
        assert await executor.run(sum, [1, 2, 3], priority=URGENT) == 6
    finally:
        executor.close()
    with pytest.raises(RuntimeError, match="closed"):
        await executor.run(sum, [1])


@pytest.mark.asyncio
async def test_background_work_waits_for_the_acquires_in_flight_and_no_longer() -> None:
    gate = AcquireGate(yield_s=30.0)
    await gate.wait_turn()  # nothing in flight: no wait at all
    gate.started()
    gate.started()
    waiting = asyncio.ensure_future(gate.wait_turn())
    await asyncio.sleep(0)  # one turn of the loop: it must still be waiting
    gate.ended()
    await asyncio.sleep(0)
    assert not waiting.done()  # one acquire is still in flight
    gate.ended()
    await asyncio.wait_for(waiting, 30)


@pytest.mark.asyncio
async def test_a_steady_stream_of_acquires_delays_background_work_only_up_to_the_bound() -> None:
    gate = AcquireGate(yield_s=0.01)
    gate.started()  # never ends
    await asyncio.wait_for(gate.wait_turn(), 30)  # returns at the bound
    assert gate.in_flight == 1


@pytest.mark.asyncio
async def test_a_call_whose_caller_gave_up_while_it_was_queued_never_runs() -> None:
    """``run``'s answer comes back on the caller's own loop future: cancelling the caller
    before a worker takes the call skips it, and the worker goes on serving."""
    executor = DbExecutor(workers=1)
    gate = threading.Event()
    started = threading.Event()
    ran: list[str] = []

    def hold() -> None:
        started.set()
        gate.wait(30)

    try:
        busy = executor.submit(hold)
        assert await asyncio.to_thread(started.wait, 30)  # the only worker is busy now
        given_up = asyncio.ensure_future(executor.run(ran.append, "given up"))
        await asyncio.sleep(0)  # queued behind the held call
        given_up.cancel()
        kept = asyncio.ensure_future(executor.run(ran.append, "kept", priority=URGENT))
        gate.set()
        assert await kept is None
        await asyncio.to_thread(busy.result, 30)
        with pytest.raises(asyncio.CancelledError):
            await given_up
        assert await executor.run(len, ran) == 1
    finally:
        gate.set()
        executor.close()
    assert ran == ["kept"]
