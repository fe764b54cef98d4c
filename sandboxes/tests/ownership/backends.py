"""One pool, two providers: the same controller tests over ``local`` and ``kubernetes``.

A :class:`Backend` hides only what differs between the two: how a controller's provider
is built (a readiness gate, sandboxes that outlive a controller, deletes that fail), how
a test sees a sandbox on the backend (an execd process / a pod in the stand-in's store)
and how it makes a labelled sandbox that no record owns. Everything else -- the
controller, its pool, pacer, database rows -- is the same code.

Both are real: the local provider spawns execd processes; the Kubernetes provider talks
HTTP to a stand-in cluster that runs a real execd per Ready pod.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandboxes import labels as L
from sandboxes.controller import Controller
from sandboxes.providers.local import records
from sandboxes.tests.conftest import local_provider
from sandboxes.tests.controller_support import (
    FailingDestroyProvider,
    GatedProvider,
    SurvivingProvider,
    create_unknown_sandbox,
    process_alive,
)
from standin import StandinCluster
from standin.harness.support import NS, k8s_provider, pod_container


@dataclass
class Hold:
    """The next create's readiness is held until ``release()``."""

    wait_reached: Callable[[], bool]
    release: Callable[[], None]


class LocalBackend:
    name = "local"

    def __init__(self, make_controller: Callable[..., Controller], root: Path, spawner: Any):
        self._make, self.root, self.spawner = make_controller, root, spawner
        self._gated: GatedProvider | None = None

    def controller(
        self, *, surviving: bool = False, failing_deletes: bool = False, **kw: Any
    ) -> Controller:
        if failing_deletes:
            provider = local_provider(
                self.root, isolation="off", cls=FailingDestroyProvider, spawner=self.spawner
            )
        elif surviving:
            provider = local_provider(
                self.root, isolation="off", cls=SurvivingProvider, spawner=self.spawner
            )
        else:
            provider = self._gated = local_provider(self.root, cls=GatedProvider)
            provider.gate.set()  # open until a test holds it
        return self._make(provider=provider, **kw)

    def hold(self) -> Hold:
        provider = self._gated
        assert provider is not None, "hold() needs a controller built by controller()"
        provider.gate.clear()
        provider.reached.clear()
        return Hold(lambda: provider.reached.wait(60), provider.gate.set)

    def alive(self, name: str) -> bool:
        record = records.read(self.root / name)
        return bool(record and record.pid and process_alive(int(record.pid)))

    def ownerless(self) -> str:
        name, _ = create_unknown_sandbox(self.root)
        return name

    def heal_deletes(self) -> None:
        """The next controller gets a provider whose deletes work."""

    def anchor_exists(self, job_id: int) -> bool:
        return False  # local sandboxes have no owner objects


class KubernetesBackend:
    name = "kubernetes"

    def __init__(self, make_controller: Callable[..., Controller], cluster: StandinCluster):
        self._make, self.cluster = make_controller, cluster
        self.built: list[Controller] = []

    def controller(
        self, *, surviving: bool = False, failing_deletes: bool = False, **kw: Any
    ) -> Controller:
        if failing_deletes:
            self.cluster.plans.add("delete", "500_not_applied", name_prefix="sm-", times=None)
        provider = k8s_provider(self.cluster, destroy_attempts=2)
        controller = self._make(provider=provider, **kw)
        self.built.append(controller)
        return controller

    def hold(self) -> Hold:
        gate = self.cluster.gates.add("ready", name_prefix="sm-")

        def reached() -> bool:
            try:
                gate.wait_reached(60)
            except TimeoutError:
                return False
            return True

        return Hold(reached, gate.release)

    def alive(self, name: str) -> bool:
        pod = self.cluster.pod(NS, name)
        return pod is not None and pod["status"].get("phase") == "Running"

    def ownerless(self) -> str:
        name = f"sm-999-{secrets.token_hex(6)}"
        self.cluster.put_pod(
            NS,
            {
                "metadata": {
                    "name": name,
                    "labels": {L.MANAGED_BY: L.VALUE_MANAGED_BY, L.JOB: "999", L.ROLE: "rollout"},
                    "annotations": {L.NONCE_ANNOTATION: secrets.token_hex(16)},
                },
                "spec": {"containers": [pod_container("task/img:1")]},
            },
        )
        return name

    def heal_deletes(self) -> None:
        self.cluster.plans.clear()

    def anchor_exists(self, job_id: int) -> bool:
        names = {c["metadata"]["name"] for c in self.cluster.configmaps(NS)}
        return f"sandman-job-{job_id}" in names

    def close(self) -> None:
        for controller in self.built:
            controller.stop()
        self.cluster.gates.release_all()
        self.cluster.run_until_idle(timeout=60)  # no execd left booting (see Rig.quiesce)
        self.cluster.stop()


@pytest.fixture(params=["local", "kubernetes"])
def backend(
    request: pytest.FixtureRequest,
    make_controller: Callable[..., Controller],
    sandbox_root: Path,
    spawner: ThreadPoolExecutor,
) -> Iterator[LocalBackend | KubernetesBackend]:
    if request.param == "local":
        yield LocalBackend(make_controller, sandbox_root, spawner)
        return
    cluster = StandinCluster(nodes=2, run_execd=True)
    cluster.start()
    k8s = KubernetesBackend(make_controller, cluster)
    try:
        yield k8s
    finally:
        k8s.close()


__all__ = ["Hold", "KubernetesBackend", "LocalBackend", "backend"]
