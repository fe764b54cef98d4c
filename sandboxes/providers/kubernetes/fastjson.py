"""Kubernetes backend: the JSON decoder of the watch streams -- ``orjson`` when it is
installed (the optional ``fast`` extra), else the standard library's.

A pod watch event (~3.8 KB) decodes in ~9 us with orjson, ~19 us with ``json``; under a
burst the decoding was ~2/3 of the pod informer's CPU. Both give the same plain
``dict``/``list``/``str``/``int``/``float``/``bool``/``None`` tree for the API server's
JSON, so callers cannot tell which ran (``test_kubernetes_fastjson.py`` compares them).
``SANDMAN_NO_ORJSON=1`` forces the fallback.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

loads: Callable[[str | bytes], Any] = json.loads
DECODER = "json"
if os.environ.get("SANDMAN_NO_ORJSON", "") != "1":
    try:
        import orjson
    except ImportError:  # the fallback: nothing to install, nothing else changes
        pass
    else:
        loads = orjson.loads
        DECODER = "orjson"
