"""Per-token request rate of the hot routes (acquire, release): token buckets, 429 +
``Retry-After`` past the limit (issue 12 item 6).

One bucket per API token key, ``SANDMAN_API_HOT_RATE_PER_S`` tokens a second up to
``SANDMAN_API_HOT_BURST`` (rate 0: no limit). The buckets are per process, like the
service's other in-memory maps: N server processes admit up to N times the rate.

Invariants a reader must not break:
* The same buckets serve the DRF views (``HotRouteThrottle``) and the ASGI fast path
  (``sandboxes.apis.fastpath``): a request refused by the fast path falls through to the
  view, whose throttle refuses it with DRF's 429 (the one error contract).
* Time is a parameter (``clock``): tests advance a fake clock, never sleep.
* The map is bounded: a full map is emptied (every caller gets a fresh burst), never grown.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from rest_framework.authtoken.models import Token
from rest_framework.throttling import BaseThrottle

_MAX_KEYS = 100_000


@dataclass
class _Bucket:
    tokens: float
    at: float


class TokenBuckets:
    """``take(key)``: 0.0 when a request is admitted, else the seconds until it would be."""

    def __init__(
        self, *, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate_per_s = rate_per_s
        self.burst = max(1, burst)
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        if self.rate_per_s <= 0:
            return 0.0
        now = self.clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= _MAX_KEYS:
                    self._buckets.clear()
                bucket = self._buckets[key] = _Bucket(tokens=float(self.burst), at=now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.at) * self.rate_per_s)
            bucket.at = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return 0.0
            return (1.0 - bucket.tokens) / self.rate_per_s


_lock = threading.Lock()
_hot: TokenBuckets | None = None


def hot_route_buckets() -> TokenBuckets:
    """The process's buckets for the hot routes, built from the settings on first use."""
    global _hot
    with _lock:
        if _hot is None:
            _hot = TokenBuckets(
                rate_per_s=float(settings.SANDMAN_API_HOT_RATE_PER_S),
                burst=int(settings.SANDMAN_API_HOT_BURST),
            )
        return _hot


def reset(buckets: TokenBuckets | None = None) -> None:
    """Forget the buckets (tests: after changing the settings, or to install a clock)."""
    global _hot
    with _lock:
        _hot = buckets


def token_key(auth: Any) -> str | None:
    """The API token key of a request's ``auth`` (a ``Token`` row, or the key itself)."""
    if isinstance(auth, Token):
        return str(auth.key)
    if isinstance(auth, str) and auth:
        return auth
    return None


class HotRouteThrottle(BaseThrottle):
    """DRF throttle over :func:`hot_route_buckets`, keyed by the caller's API token.

    Session callers (no token) are keyed by user id, so a browser cannot bypass it."""

    def __init__(self) -> None:
        self.wait_s = 0.0

    def allow_request(self, request: Any, view: Any) -> bool:
        key = token_key(request.auth)
        if key is None:
            user = request.user
            if user is None or not user.is_authenticated:
                return True  # authentication answers 401 before anything is spent
            key = f"user:{user.pk}"
        self.wait_s = hot_route_buckets().take(key)
        return self.wait_s == 0.0

    def wait(self) -> float:
        # ``Retry-After`` is whole seconds: round up, so a client that obeys it succeeds.
        return float(math.ceil(self.wait_s))
