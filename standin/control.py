"""Control routes under ``/_standin/`` for benchmarks and out-of-process tests.

Reads: ``state`` (everything), ``pods``, ``nodes``, ``events``, ``address-failures``,
``requests``, ``subnets`` (the VPC's subnets in EC2 ``DescribeSubnets``' document shape,
``subnets.py``). Writes: ``subnets/{id}/consume`` (POST ``{"count"}``: another workload
takes addresses), ``plans`` (POST adds, DELETE clears), ``gates`` (POST arms one;
GET ``gates/{id}`` reports it; POST ``gates/{id}/release``), ``bookmark``, ``compact``,
``close-watches``, ``advance`` (manual mode), ``quota/{ns}`` (POST ``{"pods", "cpu"}`` sets
the namespace's ResourceQuota, DELETE drops it), ``pods/{ns}`` (store a pod of "another
workload" without going through plans, gates or request counts), and the disruptions
``pods/{ns}/{name}/evict``, ``pods/{ns}/{name}/fail-probe``, ``nodes/{name}/lose``.
These routes are not part of the Kubernetes API and are never counted as API requests.

Every handler goes through the cluster's public control API (``StandinCluster.state()``,
``pods()``, ``put_pod()``, ... and its ``gates``, ``plans``, ``api``, ``store`` and ``sim``
collaborators), never through a private method: handlers run on the cluster's loop, where
those methods run at once.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from standin.admission import PodQuota, cpu_millis
from standin.disruptions import Disruptions
from standin.events import EventLog
from standin.gates import Gate, GateRegistry
from standin.plans import PlanRegistry
from standin.server import ApiServer
from standin.sim import Simulation
from standin.store import Store


class ControlledCluster(Protocol):
    """What these routes use of the cluster (``StandinCluster`` is the one implementation).

    Declared here rather than imported, so ``cluster`` -> ``control`` stays one-way.
    """

    gates: GateRegistry
    plans: PlanRegistry
    api: ApiServer
    store: Store
    sim: Simulation
    events_log: EventLog
    disruptions: Disruptions

    def state(self) -> dict[str, Any]: ...
    def pods(self, namespace: str | None = None) -> list[dict[str, Any]]: ...
    def nodes(self) -> list[dict[str, Any]]: ...
    def address_failures(self) -> dict[str, Any]: ...
    def request_totals(self) -> dict[str, int]: ...
    def put_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def subnets(self) -> dict[str, Any]: ...
    def consume_addresses(self, subnet_id: str, count: int) -> int: ...


def add_routes(app: web.Application, cluster: ControlledCluster) -> None:
    gates: dict[int, Gate] = {}

    async def state(request: web.Request) -> web.Response:
        return web.json_response(cluster.state())

    def reader(fn: Any) -> Any:
        async def handler(request: web.Request) -> web.Response:
            return web.json_response(fn())

        return handler

    async def add_plan(request: web.Request) -> web.Response:
        body = await request.json()
        try:
            plan = cluster.plans.add(
                body["verb"],
                body["action"],
                name_prefix=body.get("name_prefix"),
                label_selector=body.get("label_selector"),
                times=body.get("times", 1),
                retry_after_s=int(body.get("retry_after_s", 1)),
            )
        except (KeyError, ValueError, TypeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        return web.json_response(
            {"verb": plan.verb, "action": plan.action, "times": plan.times}, status=201
        )

    async def set_quota(request: web.Request) -> web.Response:
        try:
            body = await request.json()
            quota = PodQuota(
                str(body.get("name") or "sandbox-quota"),
                pods=None if body.get("pods") is None else int(body["pods"]),
                cpu_millis=None if body.get("cpu") is None else cpu_millis(body["cpu"]),
            )
        except (ValueError, TypeError, AttributeError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        cluster.api.quotas[request.match_info["ns"]] = quota
        return web.json_response({"name": quota.name, "pods": quota.pods}, status=201)

    async def clear_quota(request: web.Request) -> web.Response:
        cluster.api.quotas.pop(request.match_info["ns"], None)
        return web.json_response({"cleared": True})

    async def clear_plans(request: web.Request) -> web.Response:
        cluster.plans.clear()
        return web.json_response({"cleared": True})

    async def add_gate(request: web.Request) -> web.Response:
        body = await request.json()
        try:
            gate = cluster.gates.add(
                body["point"], name=body.get("name"), name_prefix=body.get("name_prefix")
            )
        except (KeyError, ValueError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        gates[len(gates) + 1] = gate
        return web.json_response({"id": len(gates)}, status=201)

    def _gate(request: web.Request) -> Gate | None:
        return gates.get(int(request.match_info["id"]))

    async def gate_state(request: web.Request) -> web.Response:
        gate = _gate(request)
        if gate is None:
            return web.json_response({"error": "no such gate"}, status=404)
        ctx = gate.context
        return web.json_response(
            {
                "point": gate.point,
                "reached": gate.is_reached,
                "released": gate.is_released,
                "name": ctx.name if ctx else None,
            }
        )

    async def gate_release(request: web.Request) -> web.Response:
        gate = _gate(request)
        if gate is None:
            return web.json_response({"error": "no such gate"}, status=404)
        gate.release()
        return web.json_response({"released": True})

    async def bookmark(request: web.Request) -> web.Response:
        return web.json_response({"sent": cluster.api.bookmark_all()})

    async def compact(request: web.Request) -> web.Response:
        cluster.store.compact()
        return web.json_response({"compacted_rv": cluster.store.compacted_rv})

    async def close_watches(request: web.Request) -> web.Response:
        return web.json_response({"closed": cluster.store.close_watches()})

    async def advance(request: web.Request) -> web.Response:
        body = await request.json()
        ran = cluster.sim.advance(float(body.get("seconds", 0)))
        return web.json_response({"events_run": ran, "sim_time": cluster.sim.now})

    async def put_pod(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response(cluster.put_pod(request.match_info["ns"], body), status=201)

    async def evict(request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        return web.json_response({"evicted": cluster.disruptions.evict(ns, name)})

    async def fail_probe(request: web.Request) -> web.Response:
        ns, name = request.match_info["ns"], request.match_info["name"]
        return web.json_response({"failing": cluster.disruptions.fail_probe(ns, name)})

    async def lose_node(request: web.Request) -> web.Response:
        return web.json_response(
            {"pods": cluster.disruptions.lose_node(request.match_info["name"])}
        )

    async def consume(request: web.Request) -> web.Response:
        body = await request.json()
        try:
            left = cluster.consume_addresses(request.match_info["id"], int(body.get("count", 0)))
        except KeyError:
            return web.json_response({"error": "no such subnet"}, status=404)
        return web.json_response({"AvailableIpAddressCount": left})

    r = app.router
    r.add_get("/_standin/state", state)
    r.add_get("/_standin/subnets", reader(cluster.subnets))
    r.add_post("/_standin/subnets/{id}/consume", consume)
    r.add_get("/_standin/pods", reader(lambda: cluster.pods(None)))
    r.add_get("/_standin/nodes", reader(cluster.nodes))
    r.add_get("/_standin/events", reader(lambda: cluster.events_log.list()))
    r.add_get("/_standin/address-failures", reader(cluster.address_failures))
    r.add_get("/_standin/requests", reader(cluster.request_totals))
    r.add_post("/_standin/plans", add_plan)
    r.add_delete("/_standin/plans", clear_plans)
    r.add_post("/_standin/gates", add_gate)
    r.add_get("/_standin/gates/{id}", gate_state)
    r.add_post("/_standin/gates/{id}/release", gate_release)
    r.add_post("/_standin/bookmark", bookmark)
    r.add_post("/_standin/compact", compact)
    r.add_post("/_standin/close-watches", close_watches)
    r.add_post("/_standin/advance", advance)
    r.add_post("/_standin/pods/{ns}", put_pod)
    r.add_post("/_standin/quota/{ns}", set_quota)
    r.add_delete("/_standin/quota/{ns}", clear_quota)
    r.add_post("/_standin/pods/{ns}/{name}/evict", evict)
    r.add_post("/_standin/pods/{ns}/{name}/fail-probe", fail_probe)
    r.add_post("/_standin/nodes/{name}/lose", lose_node)
