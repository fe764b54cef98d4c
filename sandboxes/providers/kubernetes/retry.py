"""Kubernetes backend: which API answers are worth sending again, and after how long.

The one retry policy of creates, list pages and watches (issue 9, items 4 and 9):

* 429 ``TooManyRequests`` (API Priority and Fairness shed the request before any handler
  read it, so nothing was stored): send again after ``Retry-After`` (the header, else the
  Status's ``details.retryAfterSeconds``, else 1 s), never longer than
  ``retry_after_max_s``, at most ``throttle_attempts`` sends. A create is resent with the
  same name and nonce.
* 403 whose message says ``exceeded quota`` (the ResourceQuota admission plugin): transient
  -- pods will finish -- so back off (the provider's ``backoff``) and retry, at most
  ``quota_attempts`` sends. Any other 403 is final.
* 422 ``Invalid``: final; :func:`invalid_fields` names the refused fields from
  ``details.causes`` for an error the trainer can act on.
* 5xx and transport errors are not decided here: a create's are ambiguous (read back by
  nonce, ``creator.py``), a watch's re-watch, a list's are retried by the informer.

Rule a reader must not break: only answers that prove nothing was stored (429, a quota 403)
make a create be sent again; everything else keeps the creator's read-back rules.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from sandboxes.providers.kubernetes.config import KubernetesConfig


def status_of(exc: BaseException) -> int:
    return (exc.status or 0) if isinstance(exc, ApiException) else 0


def status_body(exc: BaseException) -> dict[str, Any]:
    """The ``Status`` object an API error carried (empty if none could be parsed)."""
    raw = getattr(exc, "body", None)
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) else {}


def is_throttled(exc: BaseException) -> bool:
    return status_of(exc) == 429


def is_quota_exceeded(exc: BaseException) -> bool:
    message = str(status_body(exc).get("message") or "")
    return status_of(exc) == 403 and "exceeded quota" in message


def invalid_fields(exc: BaseException) -> list[str]:
    """The fields a 422 ``Invalid`` refused, in the server's order."""
    details = status_body(exc).get("details") or {}
    causes = details.get("causes") or [] if isinstance(details, dict) else []
    return [str(c.get("field")) for c in causes if isinstance(c, dict) and c.get("field")]


def retry_after_s(exc: BaseException, cap: float) -> float:
    """The wait a 429 asks for: ``Retry-After`` seconds, else the Status's, else 1; <= cap."""
    headers = getattr(exc, "headers", None) or {}
    raw: Any = headers.get("Retry-After") if hasattr(headers, "get") else None
    if raw is None:
        details = status_body(exc).get("details") or {}
        raw = details.get("retryAfterSeconds") if isinstance(details, dict) else None
    try:
        wait = float(raw) if raw is not None else 1.0
    except (TypeError, ValueError):
        wait = 1.0  # an HTTP-date Retry-After: the API server never sends one
    return max(0.0, min(cap, wait))


@dataclass(frozen=True)
class RetryPolicy:
    """How long to wait before sending again, or None when the answer is final."""

    config: KubernetesConfig
    backoff: Callable[[int], float]

    def create_delay(self, exc: BaseException, attempt: int) -> float | None:
        """For the ``attempt``-th send (1-based) of a create refused with ``exc``."""
        cfg = self.config
        if is_throttled(exc) and attempt < cfg.throttle_attempts:
            return retry_after_s(exc, cfg.retry_after_max_s)
        if is_quota_exceeded(exc) and attempt < cfg.quota_attempts:
            return self.backoff(attempt - 1)
        return None

    def idempotent_delay(self, exc: BaseException, attempt: int) -> float | None:
        """For a create that may be sent again whatever happened (409 means done): a 429
        after its Retry-After, a 5xx or a transport error after a backoff, a few times."""
        cfg = self.config
        if is_throttled(exc) and attempt < cfg.throttle_attempts:
            return retry_after_s(exc, cfg.retry_after_max_s)
        transient = not isinstance(exc, ApiException) or status_of(exc) >= 500
        if transient and attempt < cfg.quota_attempts:
            return self.backoff(attempt - 1)
        return None

    def read_delay(self, exc: BaseException, attempt: int) -> float | None:
        """For the ``attempt``-th send of a list page: only a 429 is waited out here."""
        if is_throttled(exc) and attempt < self.config.throttle_attempts:
            return retry_after_s(exc, self.config.retry_after_max_s)
        return None

    def watch_delay(self, exc: BaseException, failures: int) -> float:
        """Before re-watching after ``failures`` failed watches in a row (never relists)."""
        cfg = self.config
        if is_throttled(exc):
            return retry_after_s(exc, cfg.retry_after_max_s)
        return min(cfg.backoff_max_s, cfg.backoff_initial_s * 2 ** min(failures, 5))
