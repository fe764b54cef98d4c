"""The controller's event loop (controller/loops.py): uvloop's when installed, asyncio's with
``SANDMAN_NO_UVLOOP=1``; the controller works the same on either (one acquire, command and
release each, with the real local provider and execd)."""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from sandboxes.controller.loops import loop_kind, new_loop
from sandboxes.tests.controller_support import acquire_args, execd, make_job, state, wait_until

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


def test_the_loop_is_uvloop_when_installed_and_asyncio_when_turned_off(monkeypatch):
    monkeypatch.delenv("SANDMAN_NO_UVLOOP", raising=False)
    loop = new_loop()
    try:
        assert loop_kind(loop) == ("uvloop" if HAS_UVLOOP else "asyncio")
        assert isinstance(loop, asyncio.AbstractEventLoop)
    finally:
        loop.close()
    monkeypatch.setenv("SANDMAN_NO_UVLOOP", "1")
    loop = new_loop()
    try:
        assert loop_kind(loop) == "asyncio" and type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()


@pytest.mark.parametrize("no_uvloop", ["", "1"], ids=["default", "asyncio"])
def test_the_controller_acquires_runs_and_releases_on_either_loop(
    make_controller, monkeypatch, no_uvloop
):
    monkeypatch.setenv("SANDMAN_NO_UVLOOP", no_uvloop)
    controller = make_controller()
    expected = "uvloop" if HAS_UVLOOP and not no_uvloop else "asyncio"
    assert controller.stats()["loop"] == expected
    job = make_job()
    got = controller.acquire(**acquire_args(job))
    ran = execd(got.address, got.token, "/exec", {"command": "echo on-$((40+2))"})
    assert ran["exit_code"] == 0 and ran["output"].strip() == "on-42"
    controller.release(sandbox_id=got.sandbox_id)
    wait_until(lambda: state(got.sandbox_id) == "deleted", what="the released sandbox deleted")
