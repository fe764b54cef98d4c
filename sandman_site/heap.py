"""The garbage collector of a long-running service process: what its start built is frozen.

A web worker's start (Django, DRF, the URLconf and every view, drf-spectacular, Channels)
leaves ~170,000 objects that the cyclic collector tracks and that live as long as the
process. Each full (generation 2) collection walked them all: measured in uvicorn workers
inside a burst of acquires on this 2-core VM, one pause of 100-250 ms per worker, during
which its event loop answered nothing, so every request in flight waited for it; it
comes back whenever enough new objects have survived. ``gc.freeze()`` moves every object
tracked at that moment to a permanent generation that no later collection walks
(https://docs.python.org/3/library/gc.html#gc.freeze); what the process allocates later
is collected as before, and frozen objects are still freed by reference counting when
nothing refers to them.

Called once a process has started: ``sandman_site.asgi`` after the app is built and
warmed, ``manage.py run_controller`` once the controller has reconciled and listens.
"""

from __future__ import annotations

import gc


def freeze_start_up() -> int:
    """Collect the start's garbage, then freeze what is left; the number of frozen objects."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
