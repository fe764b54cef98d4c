"""Publish to the dashboards after the surrounding transaction commits.

Payloads are made wire-safe here (datetimes become ISO strings) because a Redis channel
layer serialises with msgpack. ``sandman_site.live.publish`` never raises by contract; a
failure is logged there.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.db import transaction

from sandman_site import live


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def publish_now(kind: str, payload: dict[str, Any]) -> None:
    """Publish at once: for a caller that has just committed on a connection Django does
    not manage (the direct hand-out's claim)."""
    live.publish(kind, _plain(payload))


def publish_on_commit(kind: str, payload: dict[str, Any]) -> None:
    body = _plain(payload)

    def send() -> None:
        live.publish(kind, body)

    transaction.on_commit(send)
