"""A stand-in Kubernetes cluster for tests, benchmarks and rehearsal (paper Appendix F).

An aiohttp server speaking the pod and ConfigMap subset of the Kubernetes API that the
official client uses, with a simulated scheduler (capacity, soft topology spread),
address assignment that fails more on crowded nodes (§5.2), image pulls by size with a
node cache (§5.3), container start and readiness -- optionally with a real execd per
pod. Gates hold a chosen call until a test releases it; failure plans change answers.

A top-level package of the source tree, beside ``execd/``; it never ships in the wheel
and no production module imports it. Rule a reader must not break: nothing here imports
Django or Sandman's apps (the cluster knows label selectors, not Sandman; the few pod keys
it shares with the provider are its own constants in ``keys.py``) -- except
``standin.harness``, the Table A21 ownership harness, which drives Sandman's controller on
purpose. ``standin/tests/test_isolation.py`` checks both. ``python -m standin`` serves one
from the command line (``cli.py``); ``standin.clock.FakeClock`` is the service's fake
clock for tests. Entry point: :class:`StandinCluster`::

    cluster = StandinCluster(nodes=4, seed=1)          # mode="virtual" | "manual" | "realtime"
    url = cluster.start()                              # background thread + own event loop
    try:
        gate = cluster.gates.add("create_stored", name="sb-1")
        cluster.plans.add("delete", "reset_after_apply", name_prefix="sb-", times=1)
        ...                                            # drive the provider against ``url``
        await gate.reached(); gate.release()           # or gate.wait_reached(10) from a thread
        assert cluster.pods("ns") == []                # the auditor's own view of the store
        cluster.request_counts()[("watch", "pods")]    # requests by (verb, resource)
    finally:
        cluster.stop()
"""

from __future__ import annotations

from standin.cluster import StandinCluster
from standin.gates import Gate, GateContext, GateRegistry
from standin.kubelet import Timings
from standin.plans import ACTIONS, Plan, PlanRegistry
from standin.scheduler import AddressModel, NodeSpec

__all__ = [
    "ACTIONS",
    "AddressModel",
    "Gate",
    "GateContext",
    "GateRegistry",
    "NodeSpec",
    "Plan",
    "PlanRegistry",
    "StandinCluster",
    "Timings",
]
