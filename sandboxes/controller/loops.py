"""The controller's event loop: uvloop's when it is installed, else asyncio's.

The controller's loop runs every create, hand-out and release of the process: under a burst
it runs ~90 callbacks per create (futures of the batched writes, the database and Kubernetes
client hand-offs, the informers' deliveries, the tasks it owns) and serves the web workers'
socket calls (``rpc.py``). uvloop (libuv, in C; installed with the ``uvicorn`` extra, which
the production server needs anyway) runs the same asyncio API with less CPU per callback.
Nothing here depends on which loop runs: both are ``asyncio.AbstractEventLoop``s.
``SANDMAN_NO_UVLOOP=1`` forces asyncio's own loop.
"""

from __future__ import annotations

import asyncio
import os


def new_loop() -> asyncio.AbstractEventLoop:
    """A new event loop for the controller's thread (not set as any thread's loop)."""
    if os.environ.get("SANDMAN_NO_UVLOOP", "") != "1":
        try:
            import uvloop
        except ImportError:  # the fallback: nothing to install, nothing else changes
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def loop_kind(loop: asyncio.AbstractEventLoop) -> str:
    """``"uvloop"`` or ``"asyncio"`` (for stats, /metrics and the benchmarks' JSON)."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
