"""The stand-in's HTTP face: the pod, ConfigMap and Event subset of the Kubernetes API.

Routes (what the official client sends): create/list/watch under
``/api/v1/namespaces/{ns}/{pods|configmaps|secrets}``, get/patch/delete on ``.../{name}``,
cluster wide list/watch on ``/api/v1/{pods|configmaps|secrets}``, and ``/version``. Events
(``/api/v1/namespaces/{ns}/events``, ``/api/v1/events``) are read-only here: get, list,
watch from their own store, which ``events.EventLog`` writes and expires. Control routes for
tests and benchmarks live under ``/_standin/`` (see ``control.py``).

Order inside each write handler (tests rely on it): count the request -> ``*_received``
gate -> take a failure plan -> "before store" faults -> store -> ``create_stored`` /
``delete_applied`` gate -> "after store" faults -> answer. Every error is a ``Status``
body whose ``code`` is the HTTP status.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from aiohttp import web

from standin import admission
from standin.events import EventLog
from standin.gates import GateContext, GateRegistry
from standin.kubelet import prepare_pod
from standin.paging import BadToken, Expired, Pager
from standin.patching import json_patch, merge_patch
from standin.plans import ACTIONS, PlanRegistry
from standin.secrets import prepare_secret
from standin.selectors import SelectorError, parse_field_selector, parse_label_selector
from standin.stats import RequestStats
from standin.status import status_body
from standin.store import CLOSE, KINDS, Gone, Store, StoreError, Watcher
from standin.termination import Terminator

JSON = "application/json"
DELETION_FIELDS = ("deletionTimestamp", "deletionGracePeriodSeconds")
PATCH_TYPES = (
    "application/merge-patch+json",
    "application/strategic-merge-patch+json",
    "application/json-patch+json",
    "application/json",
)


def _error(
    code: int, message: str, *, reason: str | None = None, name: str = "", kind: str = ""
) -> web.Response:
    body = status_body(code, message, reason=reason, name=name or None, kind=kind or None)
    return web.json_response(body, status=code)


class ApiServer:
    def __init__(
        self,
        *,
        store: Store,
        gates: GateRegistry,
        plans: PlanRegistry,
        stats: RequestStats,
        gone_mode: str = "event",
        bookmark_interval_s: float | None = None,
        precise_now: Callable[[], str] | None = None,
        terminator: Terminator | None = None,
        schedule: Callable[[float, Callable[[], None]], None] | None = None,
        events: EventLog | None = None,
    ) -> None:
        self.schedule = schedule  # run later on the simulated clock (late-landing creates)
        self.precise_now = precise_now
        self.terminator = terminator  # graceful deletion; None: a DELETE removes at once
        self.events = events
        self.store, self.gates, self.plans, self.stats = store, gates, plans, stats
        self.gone_mode = gone_mode
        self.bookmark_interval_s = bookmark_interval_s
        self._hanging: set[asyncio.Future[None]] = set()
        self.pager = Pager()
        self.quotas: dict[str, admission.PodQuota] = {}  # namespace -> its ResourceQuota

    def routes(self, app: web.Application) -> None:
        r = app.router
        r.add_get("/version", self.version)
        r.add_get("/api", self.api_versions)
        r.add_get("/api/v1/namespaces/{ns}/{resource}", self.list_or_watch)
        r.add_post("/api/v1/namespaces/{ns}/{resource}", self.create)
        r.add_get("/api/v1/namespaces/{ns}/{resource}/{name}", self.get)
        r.add_patch("/api/v1/namespaces/{ns}/{resource}/{name}", self.patch)
        r.add_delete("/api/v1/namespaces/{ns}/{resource}/{name}", self.delete)
        r.add_get("/api/v1/{resource}", self.list_or_watch)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "major": "1",
                "minor": "32",
                "gitVersion": "v1.32.0-standin",
                "platform": "linux/amd64",
            }
        )

    async def api_versions(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        )

    # --- helpers ----------------------------------------------------------------------------
    @staticmethod
    def _resource(request: web.Request) -> str | None:
        resource = request.match_info["resource"]
        return resource if resource in KINDS else None

    def _store_for(self, resource: str) -> Store:
        """Events live in their own store (expired first); everything else in ``store``."""
        if resource == "events" and self.events is not None:
            self.events.expire()
            return self.events.store
        return self.store

    @staticmethod
    def _read_only(resource: str) -> web.Response | None:
        if resource == "events":
            return _error(405, "the stand-in serves events read-only", reason="MethodNotAllowed")
        return None

    async def _hang(self) -> None:
        """Never answer: ends when the client gives up (handler cancelled) or on stop."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._hanging.add(fut)
        try:
            await fut
        finally:
            self._hanging.discard(fut)

    def cancel_hanging(self) -> None:
        for fut in list(self._hanging):
            fut.cancel()

    @staticmethod
    def _reset(request: web.Request) -> web.Response:
        """Drop the connection without an answer: the client sees a reset/abort."""
        if request.transport is not None:
            request.transport.abort()
        return web.Response(status=500)

    # --- reads --------------------------------------------------------------------------
    async def get(self, request: web.Request) -> web.StreamResponse:
        resource = self._resource(request)
        ns, name = request.match_info["ns"], request.match_info["name"]
        if resource is None:
            return _error(404, "the server could not find the requested resource")
        self.stats.record("get", resource, ns, name)
        await self.gates.hold(GateContext("get_received", "get", resource, ns, name))
        obj = self._store_for(resource).get(resource, ns, name)
        if obj is None:
            return _error(404, f'{resource} "{name}" not found', name=name, kind=resource)
        return web.json_response(obj)

    async def list_or_watch(self, request: web.Request) -> web.StreamResponse:
        resource = self._resource(request)
        if resource is None:
            return _error(404, "the server could not find the requested resource")
        ns = request.match_info.get("ns")
        q = request.query
        try:
            labels = parse_label_selector(q.get("labelSelector"))
            fields = parse_field_selector(q.get("fieldSelector"))
        except SelectorError as exc:
            return _error(400, str(exc))
        if q.get("watch") in ("true", "1"):
            return await self._watch(request, resource, ns, labels, fields)
        paging = {k: q[k] for k in ("limit", "continue") if q.get(k)}
        self.stats.record("list", resource, ns or "", "", paging or None)
        await self.gates.hold(GateContext("list_received", "list", resource, ns or ""))
        shed = self.plans.take_plan("list", "", None, ACTIONS["list"])
        if shed is not None:
            return admission.throttled_response(shed.retry_after_s)
        store = self._store_for(resource)
        items, rv = store.list(resource, ns, labels, fields)
        _, list_kind = KINDS[resource]
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if paging:
            try:
                limit = int(paging.get("limit") or 0)
                page = (
                    self.pager.next(paging["continue"], limit, store.compacted_rv, items, rv)
                    if "continue" in paging
                    else self.pager.first(items, rv, limit)
                )
            except (BadToken, ValueError) as exc:
                return _error(400, str(exc))
            except Expired as exc:
                body = status_body(410, str(exc), reason="Expired")
                body["metadata"] = {"continue": exc.fresh}
                return web.json_response(body, status=410)
            items, meta["resourceVersion"] = page.items, str(page.rv)
            if page.token:
                meta.update({"continue": page.token, "remainingItemCount": page.remaining})
        return web.json_response(
            {"kind": list_kind, "apiVersion": "v1", "metadata": meta, "items": items}
        )

    async def _watch(
        self, request: web.Request, resource: str, ns: str | None, labels: Any, fields: Any
    ) -> web.StreamResponse:
        q = request.query
        self.stats.record("watch", resource, ns or "", "")
        await self.gates.hold(GateContext("watch_received", "watch", resource, ns or ""))
        shed = self.plans.take_plan("watch", "", None, ACTIONS["watch"])
        if shed is not None and shed.action == "429":
            return admission.throttled_response(shed.retry_after_s)
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        timeout = float(q["timeoutSeconds"]) if q.get("timeoutSeconds") else None
        watcher = Watcher(resource, ns, labels, fields, bookmarks)
        live: Watcher | None = watcher  # None once the answer is a 410 ERROR event
        store = self._store_for(resource)
        try:
            initial = store.subscribe(watcher, q.get("resourceVersion"))
        except StoreError as exc:
            return _error(exc.code, exc.message, reason=exc.reason)
        except Gone as gone:
            body = status_body(410, str(gone), reason="Expired")
            if self.gone_mode == "http":
                return web.json_response(body, status=410)
            initial, live = [{"type": "ERROR", "object": body}], None
        resp = web.StreamResponse(status=200, headers={"Content-Type": JSON})
        resp.enable_chunked_encoding()
        self.stats.watch_opened()
        try:
            await resp.prepare(request)
            for event in initial:
                await resp.write(json.dumps(event).encode() + b"\n")
            if shed is not None and shed.action == "drop" and request.transport is not None:
                request.transport.abort()  # the connection breaks mid-stream (no clean end)
                return resp
            if live is not None:
                await self._pump(resp, live, timeout, store)
            await resp.write_eof()
        except (ConnectionResetError, ConnectionError):
            pass  # the client went away: nothing to deliver
        finally:
            if live is not None:
                store.unsubscribe(live)
            self.stats.watch_closed()
        return resp

    async def _pump(
        self, resp: web.StreamResponse, watcher: Watcher, timeout: float | None, store: Store
    ) -> None:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            wait = None if deadline is None else deadline - loop.time()
            if self.bookmark_interval_s and watcher.bookmarks:
                wait = (
                    self.bookmark_interval_s
                    if wait is None
                    else min(wait, self.bookmark_interval_s)
                )
            if wait is not None and wait <= 0:
                break
            try:
                item = await asyncio.wait_for(watcher.queue.get(), wait)
            except TimeoutError:
                if deadline is not None and loop.time() >= deadline:
                    break
                item = store.bookmark_event(watcher.resource)
            if item is CLOSE:
                return
            await resp.write(json.dumps(item).encode() + b"\n")
        if watcher.bookmarks:  # the API server bookmarks the end of a timed-out watch
            await resp.write(json.dumps(store.bookmark_event(watcher.resource)).encode() + b"\n")

    def bookmark_all(self) -> int:
        sent = 0
        for watcher in self.store.watchers:
            if watcher.bookmarks:
                watcher.queue.put_nowait(self.store.bookmark_event(watcher.resource))
                sent += 1
        return sent

    # --- writes -------------------------------------------------------------------------
    async def create(self, request: web.Request) -> web.StreamResponse:
        resource = self._resource(request)
        ns = request.match_info["ns"]
        if resource is None:
            return _error(404, "the server could not find the requested resource")
        if (refused := self._read_only(resource)) is not None:
            return refused
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "the request body is not an object")
        meta = body.get("metadata") or {}
        name, labels = meta.get("name", ""), meta.get("labels") or {}
        self.stats.record("create", resource, ns, name)
        await self.gates.hold(
            GateContext("create_received", "create", resource, ns, name, labels, body)
        )
        plan = self.plans.take_plan("create", name, labels, ACTIONS["create"], resource)
        action = plan.action if plan is not None else None
        if plan is not None and action == "429":
            return admission.throttled_response(plan.retry_after_s)
        if action == "403":
            return _error(
                403, f'pods "{name}" is forbidden: failure plan', name=name, kind=resource
            )
        if action == "409":
            return _error(409, f'pods "{name}" already exists', name=name, kind=resource)
        if action == "500_before_store":
            return _error(500, "Internal error occurred: failure plan")
        if action == "reset_before_store":
            return self._reset(request)
        if plan is not None and action in ("504_store_later", "reset_store_later"):
            self._store_later(plan.delay_s, ns, body)
            if action == "reset_store_later":
                return self._reset(request)
            return _error(
                504, "Timeout: request did not complete within requested timeout", reason="Timeout"
            )
        if resource == "pods":
            refused = self._admit_pod(ns, name, body)
            if refused is not None:
                return refused
            if action == "webhook_timeout":
                return admission.webhook_timeout_response()
            if request.query.get("dryRun") == "All":
                return web.json_response(admission.dry_run_object(body, ns), status=201)
            prepare_pod(body)
            if action == "scheduling_gate":  # as a mutating admission webhook would
                gates = body["spec"].setdefault("schedulingGates", [])
                gates.append({"name": "webhook.standin.example/hold"})
        try:
            if resource == "secrets":
                prepare_secret(body)
            stored = self.store.create(resource, ns, body)
        except StoreError as exc:
            return _error(exc.code, exc.message, reason=exc.reason, name=name, kind=resource)
        await self.gates.hold(
            GateContext(
                "create_stored", "create", resource, ns, stored["metadata"]["name"], labels, body
            )
        )
        if action == "504_after_store":
            return _error(
                504, "Timeout: request did not complete within requested timeout", reason="Timeout"
            )
        if action == "reset_after_store":
            return self._reset(request)
        return web.json_response(stored, status=201)

    def _admit_pod(self, ns: str, name: str, body: dict[str, Any]) -> web.Response | None:
        """Validation, then the namespace's quota: the answer refusing ``body``, or None."""
        causes = admission.validate_pod(body)
        if causes:
            return admission.invalid_response("Pod", name, causes)
        quota = self.quotas.get(ns)
        refusal = quota and quota.refusal(name, body, self.store.items("pods", ns))
        if refusal:
            return _error(403, refusal, reason="Forbidden", name=name, kind="pods")
        return None

    def _store_later(self, delay_s: float, ns: str, body: dict[str, Any]) -> None:
        """The request timed out, its write did not: commit the pod ``delay_s`` later."""
        if self.schedule is None:
            raise RuntimeError("a *_store_later plan needs the cluster's simulation")

        def store() -> None:
            prepare_pod(body)
            try:
                self.store.create("pods", ns, body)
            except StoreError:  # the name was taken meanwhile: the late write fails
                return

        self.schedule(delay_s, store)

    async def patch(self, request: web.Request) -> web.StreamResponse:
        resource = self._resource(request)
        ns, name = request.match_info["ns"], request.match_info["name"]
        if resource is None:
            return _error(404, "the server could not find the requested resource")
        if (refused := self._read_only(resource)) is not None:
            return refused
        ctype = request.content_type
        if ctype not in PATCH_TYPES:
            return _error(
                415,
                "the body of the request was in an unknown format - accepted media types "
                f"include: {', '.join(PATCH_TYPES[:3])}",
            )
        try:
            patch = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "the request body is not JSON")
        self.stats.record("patch", resource, ns, name)
        await self.gates.hold(
            GateContext(
                "patch_received",
                "patch",
                resource,
                ns,
                name,
                body=patch if isinstance(patch, dict) else None,
            )
        )
        current = self.store.get(resource, ns, name)
        if current is None:
            return _error(404, f'{resource} "{name}" not found', name=name, kind=resource)
        try:
            patched = (
                json_patch(current, patch)
                if isinstance(patch, list)
                else merge_patch(current, patch)
            )
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            return _error(422, f"invalid patch: {exc}")
        except StoreError as exc:
            return _error(exc.code, exc.message, reason=exc.reason)
        wanted_rv = (
            (patch.get("metadata") or {}).get("resourceVersion")
            if isinstance(patch, dict)
            else None
        )
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            return _error(
                409,
                "the object has been modified; please apply your changes to the latest version",
                reason="Conflict",
            )

        def apply(obj: dict[str, Any]) -> None:
            server_set = ("uid", "creationTimestamp", "generation", *DELETION_FIELDS)
            keep = {k: obj["metadata"][k] for k in server_set if k in obj["metadata"]}
            obj.clear()
            obj.update(patched)
            for k in DELETION_FIELDS:  # only a DELETE sets these, never a client's patch
                obj["metadata"].pop(k, None)
            obj["metadata"].update(keep)

        updated = self.store.update(resource, ns, name, apply)
        if self.terminator is not None:  # the last finalizer gone: a pending deletion ends
            self.terminator.after_update(resource, ns, name)
        return web.json_response(updated)

    async def delete(self, request: web.Request) -> web.StreamResponse:
        resource = self._resource(request)
        ns, name = request.match_info["ns"], request.match_info["name"]
        if resource is None:
            return _error(404, "the server could not find the requested resource")
        if (refused := self._read_only(resource)) is not None:
            return refused
        raw = await request.read()
        try:
            options = json.loads(raw) if raw else {}
        except json.JSONDecodeError:
            return _error(400, "the request body is not JSON")
        pre = (options or {}).get("preconditions") or {}
        grace = (options or {}).get("gracePeriodSeconds")
        if grace is None and request.query.get("gracePeriodSeconds"):
            grace = request.query["gracePeriodSeconds"]
        try:
            grace_s = None if grace is None else int(grace)
        except (TypeError, ValueError):
            return _error(400, f"gracePeriodSeconds must be an integer, not {grace!r}")
        self.stats.record("delete", resource, ns, name)
        current = self.store.get(resource, ns, name)
        labels = (current or {}).get("metadata", {}).get("labels") or {}
        await self.gates.hold(
            GateContext("delete_received", "delete", resource, ns, name, labels, options)
        )
        action = (
            self.plans.take("delete", name, labels, ACTIONS["delete"])
            if resource == "pods"
            else None
        )
        if action == "500_not_applied":
            return _error(500, "Internal error occurred: failure plan")
        if action == "hang_not_applied":
            await self._hang()
        try:
            if self.terminator is not None:
                gone = self.terminator.delete(
                    resource,
                    ns,
                    name,
                    uid=pre.get("uid"),
                    resource_version=pre.get("resourceVersion"),
                    grace_s=grace_s,
                )
            else:
                gone = self.store.delete(
                    resource,
                    ns,
                    name,
                    uid=pre.get("uid"),
                    resource_version=pre.get("resourceVersion"),
                )
        except StoreError as exc:
            return _error(exc.code, exc.message, reason=exc.reason, name=name, kind=resource)
        await self.gates.hold(
            GateContext("delete_applied", "delete", resource, ns, name, labels, options)
        )
        if action == "reset_after_apply":
            return self._reset(request)
        if action == "hang_after_apply":
            await self._hang()
        return web.json_response(gone)
