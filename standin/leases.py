"""The stand-in's ``coordination.k8s.io/v1`` Leases: what leader election reads and writes.

Routes under ``/apis/coordination.k8s.io/v1``: create (POST), list, get, replace (PUT) and
delete on ``namespaces/{ns}/leases[/{name}]``, plus ``/apis/coordination.k8s.io/v1/leases``
(all namespaces). Semantics follow the API server
(https://kubernetes.io/docs/concepts/architecture/leases/,
https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/lease-v1/,
https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions):

* a create of a name that exists is ``409 AlreadyExists``;
* a replace must carry the ``metadata.resourceVersion`` it read: another version is
  ``409 Conflict`` ("the object has been modified"), none at all is ``422 Invalid``
  (the Lease strategy allows no unconditional update); a replace of a missing Lease is
  ``404`` (no create on update); a body naming another object is ``400``;
* every write bumps the resourceVersion; ``spec.leaseDurationSeconds`` must be > 0 and
  the MicroTime fields ``acquireTime`` / ``renewTime`` must parse (stored as RFC 3339 with
  microseconds, ``Z``), else ``422 Invalid``.

For tests, the stored versions of a Lease (the last ``WRITES_KEPT``) are kept in write
order with the number of watch streams open on the API server when each was written
(:meth:`LeaseApi.writes`): what a watch on the Lease would have delivered, and whether its
holder's informers were still watching when it wrote it.

Invariant: everything runs on the cluster's server loop (no locks), and a stored Lease is
never mutated in place (a replace stores a new dict), so answers can share it.
"""

from __future__ import annotations

import collections
import datetime as dt
import itertools
import json
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from standin.stats import RequestStats
from standin.status import status_body

GROUP_VERSION = "coordination.k8s.io/v1"
PREFIX = "/apis/coordination.k8s.io/v1"
MICROTIME_FIELDS = ("acquireTime", "renewTime")
WRITES_KEPT = 10_000  # per Lease: hours of renewals, bounded for a long-running stand-in

Obj = dict[str, Any]


def _error(code: int, message: str, *, reason: str | None = None, name: str = "") -> web.Response:
    body = status_body(code, message, reason=reason, name=name or None, kind="leases")
    body["details"]["group"] = "coordination.k8s.io"
    return web.json_response(body, status=code)


def _microtime(value: Any) -> str:
    """A MicroTime as the API server writes it, or ValueError."""
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a time string")
    parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone")
    return parsed.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _spec_causes(spec: Any) -> tuple[Obj, list[Obj]]:
    """The normalised spec and the validation causes (empty when valid)."""
    if spec is None:
        return {}, []
    if not isinstance(spec, dict):
        return {}, [
            {"field": "spec", "message": "must be an object", "reason": "FieldValueInvalid"}
        ]
    out, causes = dict(spec), []
    duration = spec.get("leaseDurationSeconds")
    if duration is not None and (not isinstance(duration, int) or duration <= 0):
        causes.append(
            {
                "field": "spec.leaseDurationSeconds",
                "message": "must be greater than 0",
                "reason": "FieldValueInvalid",
            }
        )
    for name in MICROTIME_FIELDS:
        if spec.get(name) is None:
            continue
        try:
            out[name] = _microtime(spec[name])
        except ValueError as exc:
            causes.append(
                {"field": f"spec.{name}", "message": str(exc), "reason": "FieldValueInvalid"}
            )
    return out, causes


class LeaseApi:
    """Leases in a store of their own; resourceVersions from their own counter (opaque to
    clients, as the API documents)."""

    def __init__(self, *, now: Callable[[], str], stats: RequestStats) -> None:
        self._now = now
        self._stats = stats
        self._leases: dict[tuple[str, str], Obj] = {}
        self._writes: dict[tuple[str, str], collections.deque[Obj]] = {}
        self._rv = itertools.count(1)

    def routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get(f"{PREFIX}/leases", self.list_leases)
        r.add_get(f"{PREFIX}/namespaces/{{ns}}/leases", self.list_leases)
        r.add_post(f"{PREFIX}/namespaces/{{ns}}/leases", self.create)
        r.add_get(f"{PREFIX}/namespaces/{{ns}}/leases/{{name}}", self.get)
        r.add_put(f"{PREFIX}/namespaces/{{ns}}/leases/{{name}}", self.replace)
        r.add_delete(f"{PREFIX}/namespaces/{{ns}}/leases/{{name}}", self.delete)

    # --- for tests ------------------------------------------------------------------------
    def lease(self, ns: str, name: str) -> Obj | None:
        return self._leases.get((ns, name))

    def writes(self, ns: str, name: str) -> list[Obj]:
        """``{"lease": stored version, "open_watches": n}`` per create and replace, oldest
        first (the last ``WRITES_KEPT``)."""
        return list(self._writes.get((ns, name), ()))

    def _store(self, ns: str, name: str, lease: Obj) -> None:
        self._leases[(ns, name)] = lease
        entry = {"lease": lease, "open_watches": self._stats.watching}
        kept = self._writes.setdefault((ns, name), collections.deque(maxlen=WRITES_KEPT))
        kept.append(entry)

    # --- reads ----------------------------------------------------------------------------
    async def list_leases(self, request: web.Request) -> web.Response:
        ns = request.match_info.get("ns")
        self._stats.record("list", "leases", ns or "", "")
        items = [v for (n, _), v in sorted(self._leases.items()) if ns is None or n == ns]
        return web.json_response(
            {
                "kind": "LeaseList",
                "apiVersion": GROUP_VERSION,
                "metadata": {"resourceVersion": str(next(self._rv))},
                "items": items,
            }
        )

    async def get(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        self._stats.record("get", "leases", ns, name)
        lease = self._leases.get((ns, name))
        if lease is None:
            return _error(404, f'leases.coordination.k8s.io "{name}" not found', name=name)
        return web.json_response(lease)

    # --- writes ---------------------------------------------------------------------------
    @staticmethod
    async def _body(request: web.Request) -> Obj | web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("metadata") or {}, dict):
            return _error(400, "the request body is not a Lease object")
        return body

    def _stamp(self, ns: str, spec: Obj, meta: Obj) -> Obj:
        meta = {**meta, "namespace": ns, "resourceVersion": str(next(self._rv))}
        return {"kind": "Lease", "apiVersion": GROUP_VERSION, "metadata": meta, "spec": spec}

    async def create(self, request: web.Request) -> web.Response:
        ns = request.match_info["ns"]
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        meta = dict(body.get("metadata") or {})
        name = meta.get("name") or ""
        self._stats.record("create", "leases", ns, name)
        if not name:
            return _error(422, "Lease.coordination.k8s.io is invalid: metadata.name: Required")
        if meta.get("namespace") not in (None, "", ns):
            return _error(400, "the namespace of the provided object does not match")
        spec, causes = _spec_causes(body.get("spec"))
        if causes:
            return self._invalid(name, causes)
        if (ns, name) in self._leases:
            return _error(
                409,
                f'leases.coordination.k8s.io "{name}" already exists',
                reason="AlreadyExists",
                name=name,
            )
        meta.pop("resourceVersion", None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=self._now())
        lease = self._stamp(ns, spec, meta)
        self._store(ns, name, lease)
        return web.json_response(lease, status=201)

    async def replace(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        body = await self._body(request)
        if isinstance(body, web.Response):
            return body
        self._stats.record("replace", "leases", ns, name)
        meta = dict(body.get("metadata") or {})
        if meta.get("name") not in (None, "", name):
            return _error(
                400,
                f"the name of the object ({meta.get('name')}) does not match the name on "
                f"the URL ({name})",
            )
        current = self._leases.get((ns, name))
        if current is None:
            return _error(404, f'leases.coordination.k8s.io "{name}" not found', name=name)
        wanted = meta.get("resourceVersion")
        if not wanted:
            return self._invalid(
                name,
                [
                    {
                        "field": "metadata.resourceVersion",
                        "message": "must be specified for an update",
                        "reason": "FieldValueInvalid",
                    }
                ],
            )
        if wanted != current["metadata"]["resourceVersion"]:
            return _error(
                409,
                f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the '
                "object has been modified; please apply your changes to the latest version "
                "and try again",
                reason="Conflict",
                name=name,
            )
        spec, causes = _spec_causes(body.get("spec"))
        if causes:
            return self._invalid(name, causes)
        kept = {k: current["metadata"][k] for k in ("uid", "creationTimestamp")}
        meta.update(name=name, **kept)
        lease = self._stamp(ns, spec, meta)
        self._store(ns, name, lease)
        return web.json_response(lease)

    async def delete(self, request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        self._stats.record("delete", "leases", ns, name)
        lease = self._leases.pop((ns, name), None)
        if lease is None:
            return _error(404, f'leases.coordination.k8s.io "{name}" not found', name=name)
        return web.json_response(lease)

    @staticmethod
    def _invalid(name: str, causes: list[Obj]) -> web.Response:
        body = status_body(
            422,
            f'Lease.coordination.k8s.io "{name}" is invalid: '
            + "; ".join(f"{c['field']}: {c['message']}" for c in causes),
            reason="Invalid",
            name=name,
            kind="Lease",
        )
        body["details"].update(group="coordination.k8s.io", causes=causes)
        return web.json_response(body, status=422)
