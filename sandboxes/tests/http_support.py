"""JSON over HTTP for tests: standard library only, so it imports without Django set up
(``local_support`` is imported by provider processes a test starts)."""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def post_json(url: str, payload: Any, *, headers: dict[str, str], timeout_s: float = 60) -> Any:
    """POST ``payload`` as JSON with ``headers`` (auth) and return the decoded answer; an
    HTTP error status raises ``urllib.error.HTTPError``."""
    request = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={**headers, "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read())
