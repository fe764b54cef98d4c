"""Paged lists (``limit`` / ``continue``) as kube-apiserver serves them from etcd.

Imitates "Kubernetes API Concepts -- Retrieving large results sets in chunks"
(https://kubernetes.io/docs/reference/using-api/api-concepts/#retrieving-large-results-sets-in-chunks):

* a list with ``limit`` answers at most that many items, in key order (namespace, name),
  with ``metadata.continue`` (an opaque token) and ``remainingItemCount`` while more remain;
* every page of one list is served from the snapshot of the first page, and every page
  carries that first page's ``resourceVersion``;
* a token whose snapshot was compacted away (its version is older than the store's
  compacted version -- ``Store.compact()``) answers 410 ``Expired`` with the API server's
  "The provided continue parameter is too old ..." message and, in the Status's
  ``metadata.continue``, a fresh token that resumes after the same key against the
  current state (an inconsistent remainder, as the real server offers).

Rules a reader must not break: snapshots hold references to the store's immutable object
snapshots (never copies); at most ``max_snapshots`` lists are kept, the oldest forgotten
first (its token then expires like a compacted one); a token that does not decode is 400.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import itertools
import json
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

Obj = dict[str, Any]

EXPIRED_MSG = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted "
    "between the time the first chunk was returned and now may show up in the list."
)


class BadToken(Exception):
    """The continue token does not decode (400)."""


class Expired(Exception):
    """The token's snapshot is gone (410); ``fresh`` resumes it inconsistently."""

    def __init__(self, fresh: str) -> None:
        super().__init__(EXPIRED_MSG)
        self.fresh = fresh


@dataclass
class _Snapshot:
    rv: int
    keys: list[tuple[str, str]]
    items: list[Obj]


@dataclass
class Page:
    items: list[Obj]
    rv: int
    token: str | None
    remaining: int | None


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


def _encode(snapshot_id: int, rv: int, after: tuple[str, str]) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "id": snapshot_id, "rv": rv, "start": list(after)})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode(token: str) -> tuple[int, int, tuple[str, str]]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        data = json.loads(raw)
        ns, name = data["start"]
        return int(data["id"]), int(data["rv"]), (str(ns), str(name))
    except (binascii.Error, ValueError, KeyError, TypeError) as exc:
        raise BadToken(f"continue key is not valid: {exc}") from exc


@dataclass
class Pager:
    """Serves pages from list snapshots; lives beside the store on the server's loop."""

    max_snapshots: int = 256
    _snapshots: OrderedDict[int, _Snapshot] = field(default_factory=OrderedDict)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def _keep(self, rv: int, items: list[Obj]) -> int:
        ordered = sorted(items, key=_key)
        snapshot_id = next(self._ids)
        self._snapshots[snapshot_id] = _Snapshot(rv, [_key(o) for o in ordered], ordered)
        while len(self._snapshots) > self.max_snapshots:
            self._snapshots.popitem(last=False)
        return snapshot_id

    def first(self, items: list[Obj], rv: int, limit: int) -> Page:
        """The first page of a new list of ``items`` (the store's current matches at ``rv``)."""
        snapshot_id = self._keep(rv, items)
        return self._page(snapshot_id, 0, limit)

    def next(
        self, token: str, limit: int | None, compacted_rv: int, current: list[Obj], rv: int
    ) -> Page:
        """The page after ``token``; :class:`Expired` if its snapshot was compacted away.

        ``current``/``rv`` are the store's matches now: the fresh token of an expired one
        is a new snapshot of them, resuming after the same key.
        """
        snapshot_id, token_rv, after = _decode(token)
        snapshot = self._snapshots.get(snapshot_id)
        if snapshot is None or snapshot.rv != token_rv or token_rv < compacted_rv:
            fresh_id = self._keep(rv, current)
            raise Expired(_encode(fresh_id, rv, after))
        start = bisect.bisect_right(snapshot.keys, after)
        return self._page(snapshot_id, start, limit)

    def _page(self, snapshot_id: int, start: int, limit: int | None) -> Page:
        snapshot = self._snapshots[snapshot_id]
        end = len(snapshot.items) if not limit or limit <= 0 else start + limit
        items = snapshot.items[start:end]
        remaining = max(0, len(snapshot.items) - end)
        if remaining and items:
            token = _encode(snapshot_id, snapshot.rv, _key(items[-1]))
            return Page(items, snapshot.rv, token, remaining)
        self._snapshots.pop(snapshot_id, None)  # the list is complete: nobody continues it
        return Page(items, snapshot.rv, None, None)
