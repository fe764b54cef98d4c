"""The one filter every operator chart takes: time range, jobs, backend and top N, from the URL.

:func:`parse_filter` reads a page's query string (``?minutes=`` or ``?from=&to=``,
``?job=3&job=7`` or ``?job=3,7``, ``?backend=kubernetes``, ``?top=8``) into a frozen
:class:`ChartFilter`; pages hand it to each chart's build and the selectors apply it IN SQL
with :meth:`ChartFilter.sandboxes`, :meth:`ChartFilter.acquisitions` and
:meth:`ChartFilter.job_rows` (a queryset in, the same queryset narrowed out). The filter
writes itself back as a query string (:meth:`ChartFilter.query`), so the page's links, its
CSV/JSON links and the page script's refetches all carry the same view and a URL can be
shared.

Rules a reader must not break:
* ``from``/``to``, when given, replace ``minutes`` (the page's form sends both).
* Time is a parameter: ``now`` is passed in (the page reads the clock once, at the edge).
* Bad input is :class:`~sandman_site.errors.InvalidInput` (a JSON 400 through
  ``dashboards.access``), never a 500 and never silently ignored.
* A job-keyed record with no backend of its own (a trajectory, a learner step) matches a
  backend when its job has at least one sandbox there (an ``EXISTS`` on the job's index).
* An acquisition matches a backend through the sandbox it got; one that got none (timed out
  before a sandbox was bound) has no backend and is left out when a backend is chosen.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.db.models import Exists, OuterRef, QuerySet
from django.http import QueryDict

from dashboards.window import (
    MAX_MINUTES,
    Window,
    parse_minutes,
    window_between,
    window_ending,
)
from sandboxes.models import Sandbox
from sandman_site.errors import InvalidInput

BACKENDS = ("local", "kubernetes")
DEFAULT_TOP = 8
MAX_TOP = 50
MAX_JOBS = 50
OTHERS = "others"

Q = TypeVar("Q", bound=QuerySet)
R = TypeVar("R")


@dataclass(frozen=True)
class ChartFilter:
    """What one view of the operator pages shows: ``window``, and optionally only ``job_ids``,
    only sandboxes on ``backend``, with per-job axes cut to the ``top`` jobs plus "others"."""

    window: Window
    job_ids: tuple[int, ...] = ()
    backend: str = ""
    top: int = DEFAULT_TOP
    # True when the range came as from/to (kept in links instead of ``minutes``).
    fixed_range: bool = False
    # Reads several charts of one request share (e.g. the training page's attributions),
    # kept for as long as this filter lives: one request, since each request parses its own.
    memo: dict[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def remember(self, key: str, compute: Callable[[], R]) -> R:
        """``compute()`` once per filter (per request); later charts reuse the answer."""
        if key not in self.memo:
            self.memo[key] = compute()
        return self.memo[key]

    def sandboxes(self, qs: Q, *, prefix: str = "") -> Q:
        """Sandbox rows (or rows reached through ``prefix``, e.g. ``"sandbox__"``) in scope."""
        if self.job_ids:
            qs = qs.filter(**{f"{prefix}job_id__in": self.job_ids})
        if self.backend:
            qs = qs.filter(**{f"{prefix}backend": self.backend})
        return qs

    def acquisitions(self, qs: Q) -> Q:
        """Acquisition rows in scope (backend through the sandbox they got)."""
        if self.job_ids:
            qs = qs.filter(job_id__in=self.job_ids)
        if self.backend:
            qs = qs.filter(sandbox__backend=self.backend)
        return qs

    def job_rows(self, qs: Q, *, job_field: str = "job_id") -> Q:
        """Rows keyed by a job (trajectories, learner steps, jobs with ``job_field="pk"``)."""
        if self.job_ids:
            qs = qs.filter(**{f"{job_field}__in": self.job_ids})
        if self.backend:
            on_backend = Sandbox.objects.filter(job_id=OuterRef(job_field), backend=self.backend)
            qs = qs.filter(Exists(on_backend))
        return qs

    def query(self, **override: str) -> str:
        """This view as a query string (no ``?``); ``override`` replaces single parameters."""
        params: dict[str, str] = {}
        if self.fixed_range:
            params["from"] = _iso(self.window.since)
            params["to"] = _iso(self.window.until)
        else:
            params["minutes"] = str(self.window.minutes)
        if self.job_ids:
            params["job"] = ",".join(str(j) for j in self.job_ids)
        if self.backend:
            params["backend"] = self.backend
        if self.top != DEFAULT_TOP:
            params["top"] = str(self.top)
        params.update(override)
        if "from" in override or "to" in override:
            params.pop("minutes", None)
        if "minutes" in override:
            params.pop("from", None)
            params.pop("to", None)
        return urlencode({k: v for k, v in params.items() if v != ""})


def _iso(value: dt.datetime) -> str:
    return value.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_instant(raw: str, name: str) -> dt.datetime:
    """``from``/``to``: ISO 8601 (naive means UTC) or float epoch seconds."""
    text = raw.strip()
    try:
        return dt.datetime.fromtimestamp(float(text), tz=dt.UTC)
    except (ValueError, OverflowError, OSError):
        pass
    try:
        value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidInput(
            f"{name} must be an ISO 8601 time or epoch seconds, got {text[:40]!r}."
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


def _window(params: QueryDict, now: dt.datetime) -> tuple[Window, bool]:
    raw_from, raw_to = params.get("from", ""), params.get("to", "")
    if not raw_from and not raw_to:
        return window_ending(now=now, minutes=parse_minutes(params.get("minutes"))), False
    until = parse_instant(raw_to, "to") if raw_to else now
    if not raw_from:
        raise InvalidInput("from is required when to is given.")
    since = parse_instant(raw_from, "from")
    span_min = (until - since).total_seconds() / 60
    if not 1 <= span_min <= MAX_MINUTES:
        raise InvalidInput(
            f"from..to must span between 1 minute and {MAX_MINUTES} minutes, got {span_min:.1f}."
        )
    return window_between(since=since, until=until), True


def _job_ids(params: QueryDict) -> tuple[int, ...]:
    ids: list[int] = []
    for raw in params.getlist("job"):
        for part in raw.split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isdigit() or len(part) > 12:
                raise InvalidInput(f"job must be job ids, got {part[:40]!r}.")
            if int(part) not in ids:
                ids.append(int(part))
    if len(ids) > MAX_JOBS:
        raise InvalidInput(f"At most {MAX_JOBS} jobs, got {len(ids)}.")
    return tuple(ids)


def _backend(params: QueryDict) -> str:
    backend = params.get("backend", "")
    if backend and backend not in BACKENDS:
        raise InvalidInput(f"backend must be one of {', '.join(BACKENDS)}, got {backend[:40]!r}.")
    return backend


def _top(params: QueryDict) -> int:
    raw = params.get("top", "")
    if raw == "":
        return DEFAULT_TOP
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_TOP:
        raise InvalidInput(f"top must be a whole number from 1 to {MAX_TOP}, got {raw[:40]!r}.")
    return int(raw)


def parse_filter(params: QueryDict, *, now: dt.datetime) -> ChartFilter:
    """The filter of one request's query string (``InvalidInput`` for any bad parameter)."""
    window, fixed = _window(params, now)
    return ChartFilter(
        window=window,
        job_ids=_job_ids(params),
        backend=_backend(params),
        top=_top(params),
        fixed_range=fixed,
    )


def top_with_others(
    rows: Sequence[R],
    *,
    top: int,
    volume: Callable[[R], float],
    merge: Callable[[Sequence[R]], R],
) -> list[R]:
    """The ``top`` rows by ``volume`` (ties in the given order) plus one merged "others" row.

    The rows are already one per group (aggregated in SQL); this only folds the tail so a
    per-job axis stays legible. The kept rows keep their original order.
    """
    if len(rows) <= top:
        return list(rows)
    ranked = sorted(range(len(rows)), key=lambda i: (-volume(rows[i]), i))
    keep = set(ranked[:top])
    kept = [row for i, row in enumerate(rows) if i in keep]
    rest = [row for i, row in enumerate(rows) if i not in keep]
    return [*kept, merge(rest)]
