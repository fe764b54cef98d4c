"""``sandboxes.apis.batches.Batches``: the direct hand-out's group commit, on its own.

Each batch's run is held at a gate (an ``asyncio.Event``) while calls arrive, so what goes
in which batch is decided by the test, never by timing. ``asyncio.sleep(0)`` only lets the
tasks just created make their first step (they are queued before the test's own wake-up);
what they did is then asserted, not waited for.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from asgiref.sync import async_to_sync

from sandboxes.apis.batches import Batches


class Runner:
    """A batch run that records its batches and waits at a gate per batch."""

    def __init__(self, fail_on: set[str] | None = None) -> None:
        self.batches: list[list[str]] = []
        self.started = [asyncio.Event() for _ in range(8)]  # batch n is under way
        self.entered = self.started[0]
        self.gates: list[asyncio.Event] = []
        self.asked: list[list[bool]] = []
        self.fail_on = fail_on or set()

    async def __call__(self, items: list[str], wanted: Callable[[int], bool]) -> list[str]:
        self.batches.append(list(items))
        gate = asyncio.Event()
        self.gates.append(gate)
        self.started[len(self.batches) - 1].set()
        await gate.wait()
        self.asked.append([wanted(i) for i in range(len(items))])
        if self.fail_on & set(items):
            raise ConnectionError("the database went away")
        return [item.upper() for item in items]


def run(test: Callable[[], Any]) -> Any:
    return async_to_sync(test)()


def test_a_lone_call_goes_at_once_and_calls_that_wait_meanwhile_go_together() -> None:
    async def scenario() -> None:
        runner = Runner()
        batches: Batches[str, str] = Batches(runner, in_flight=1)
        first = asyncio.ensure_future(batches.call("g", "a"))
        await runner.entered.wait()  # no company waited for: the batch is under way
        assert runner.batches == [["a"]]
        rest = [asyncio.ensure_future(batches.call("g", x)) for x in "bcd"]
        await asyncio.sleep(0)  # their first steps: each queued itself
        assert batches.waiting("g") == 3 and runner.batches == [["a"]]
        runner.gates[0].set()
        assert await first == "A"
        await runner.started[1].wait()
        runner.gates[1].set()
        assert await asyncio.gather(*rest) == ["B", "C", "D"]
        assert runner.batches == [["a"], ["b", "c", "d"]]
        assert batches.waiting("g") == 0

    run(scenario)


def test_groups_are_batched_apart_and_up_to_in_flight_batches_of_one_group_run_at_once() -> None:
    async def scenario() -> None:
        runner = Runner()
        batches: Batches[str, str] = Batches(runner, in_flight=2, most=2)
        order = [("g", "a"), ("g", "b"), ("h", "c"), ("g", "d"), ("g", "e"), ("g", "f")]
        calls = [asyncio.ensure_future(batches.call(group, x)) for group, x in order]
        for started in runner.started[:3]:
            await started.wait()
        # Two runners of g took a batch each (at most two calls), h its own; f waits.
        assert sorted(runner.batches) == [["a", "b"], ["c"], ["d", "e"]]
        assert batches.waiting("g") == 1
        for gate in list(runner.gates):
            gate.set()
        await runner.started[3].wait()
        runner.gates[3].set()
        assert await asyncio.gather(*calls) == ["A", "B", "C", "D", "E", "F"]
        assert runner.batches[3] == ["f"]

    run(scenario)


def test_a_batchs_failure_is_each_of_its_calls_and_the_next_batch_runs() -> None:
    async def scenario() -> None:
        runner = Runner(fail_on={"a"})
        batches: Batches[str, str] = Batches(runner, in_flight=1)
        first = asyncio.ensure_future(batches.call("g", "a"))
        await runner.entered.wait()
        second = [asyncio.ensure_future(batches.call("g", x)) for x in "bc"]
        await asyncio.sleep(0)
        runner.gates[0].set()
        with pytest.raises(ConnectionError):
            await first
        await runner.started[1].wait()
        runner.gates[1].set()
        assert await asyncio.gather(*second) == ["B", "C"]

    run(scenario)


def test_a_caller_that_leaves_is_dropped_before_its_batch_and_asked_about_during_it() -> None:
    async def scenario() -> None:
        runner = Runner()
        batches: Batches[str, str] = Batches(runner, in_flight=1)
        first = asyncio.ensure_future(batches.call("g", "a"))
        await runner.entered.wait()
        gone = asyncio.ensure_future(batches.call("g", "b"))
        stays = asyncio.ensure_future(batches.call("g", "c"))
        await asyncio.sleep(0)
        gone.cancel()  # before its batch: never sent
        first_gone = asyncio.ensure_future(batches.call("g", "x"))
        await asyncio.sleep(0)
        runner.gates[0].set()
        assert await first == "A"
        await runner.started[1].wait()
        assert runner.batches[1] == ["c", "x"]
        first_gone.cancel()  # during its batch: the run is told it is no longer wanted
        await asyncio.sleep(0)
        runner.gates[1].set()
        assert await stays == "C"
        assert runner.asked[1] == [True, False]
        with pytest.raises(asyncio.CancelledError):
            await gone

    run(scenario)


def test_close_cancels_the_calls_waiting_and_the_batches_under_way() -> None:
    async def scenario() -> None:
        runner = Runner()
        batches: Batches[str, str] = Batches(runner, in_flight=1)
        under_way = asyncio.ensure_future(batches.call("g", "a"))
        await runner.entered.wait()
        waiting = asyncio.ensure_future(batches.call("g", "b"))
        await asyncio.sleep(0)
        await batches.close()
        for call in (under_way, waiting):
            with pytest.raises(asyncio.CancelledError):
                await call
        assert batches.waiting("g") == 0

    run(scenario)
