"""``GET /metrics``: Prometheus text exposition (format 0.0.4) through ``prometheus_client``.

A custom collector (``SandmanCollector``) reads every number once per scrape from the
aggregate queries in ``sandboxes.selectors`` (one per family, never a Python loop over
rows, never a query per sample), so a scrape costs the same with ten sandboxes or ten
million. Each scrape builds its own registry: no process-wide metric objects to keep in
step with the database. The pacer queue length is read from the controller only if this
process started one; a scrape never builds or starts a controller.

Families (names are a contract with dashboards and alerts: add, never rename):
* ``sandman_creates_total`` counter — sandboxes ever requested (one row per create).
* ``sandman_create_to_ready_seconds`` histogram — ``requested_at`` → ``ready_at``.
* ``sandman_acquisitions_total{source,outcome}`` counter.
* ``sandman_sandboxes{state}`` gauge — every state, zeros included.
* ``sandman_pacer_queue_length`` gauge.
* ``sandman_subnet_free_addresses{subnet,zone}`` gauge — the latest reading per subnet
  (``sandboxes.addresses``); ``sandman_address_floor`` gauge — its floor;
  ``sandman_address_floor_reached`` gauge — 1 while the pool creates nothing for it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from sandboxes import selectors
from sandboxes.states import SandboxState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Create-to-Ready bounds (s): local creates take tens of ms, cluster creates seconds to
# minutes (paper Figure 3: p99 well past 10 s inside the address-failure window).
CREATE_TO_READY_BUCKETS_S = (
    0.025,
    0.05,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
)


def _bound(value: float) -> str:
    """A bucket bound as the ``le`` label has always read: ``"1"``, ``"0.025"``, ``"600"``."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def pacer_queue_length() -> int:
    """Creates waiting in the pacer, from the controller of THIS process if it runs.

    Reads the already-installed instance only (``get_controller`` would build one).
    """
    package = sys.modules.get("sandboxes.controller")
    current = getattr(package, "current_controller", None)
    if callable(current):
        controller = current()
    else:
        core = sys.modules.get("sandboxes.controller.core")
        controller = getattr(core, "_controller", None)
    if controller is None or not getattr(controller, "started", False):
        return 0
    return int(controller.pacer_queue_length())


class SandmanCollector:
    """Every family of ``/metrics``, read from the database when the registry collects."""

    def describe(self) -> list[Metric]:
        return []  # registering must not query the database

    def collect(self) -> Iterator[Metric]:
        creates = CounterMetricFamily("sandman_creates", "Sandboxes ever requested.")
        creates.add_metric([], selectors.sandbox_create_total())
        yield creates

        hist = selectors.create_to_ready_histogram(bounds_s=CREATE_TO_READY_BUCKETS_S)
        c2r = HistogramMetricFamily(
            "sandman_create_to_ready_seconds", "Create-to-Ready time (requested to Ready)."
        )
        buckets = [(_bound(bound), count) for bound, count in hist.buckets]
        c2r.add_metric([], buckets + [("+Inf", hist.count)], sum_value=hist.sum_s)
        yield c2r

        acquisitions = CounterMetricFamily(
            "sandman_acquisitions",
            "Acquire calls by where the sandbox came from and outcome.",
            labels=["source", "outcome"],
        )
        for source, outcome, count in selectors.acquisition_counts():
            acquisitions.add_metric([source or "none", outcome], count)
        yield acquisitions

        sandboxes = GaugeMetricFamily("sandman_sandboxes", "Sandboxes by state.", labels=["state"])
        states = selectors.sandbox_state_counts()
        for state in SandboxState.values:
            sandboxes.add_metric([state], states.get(state, 0))
        yield sandboxes

        free = GaugeMetricFamily(
            "sandman_subnet_free_addresses",
            "Free pod addresses per subnet, latest reading (AvailableIpAddressCount).",
            labels=["subnet", "zone"],
        )
        latest = selectors.latest_subnet_samples()
        for sample in latest:
            free.add_metric([sample.subnet_id, sample.zone], sample.available)
        yield free
        floor = max((sample.floor for sample in latest), default=0)
        yield GaugeMetricFamily(
            "sandman_address_floor", "Free addresses under which creates stop.", value=floor
        )
        yield GaugeMetricFamily(
            "sandman_address_floor_reached",
            "1 while a subnet is under the address floor and the pool creates nothing.",
            value=1 if selectors.address_floor_closed() else 0,
        )

        yield GaugeMetricFamily(
            "sandman_pacer_queue_length",
            "Creates waiting for a pacing token in this process.",
            value=pacer_queue_length(),
        )


def render() -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SandmanCollector())
    return generate_latest(registry).decode("utf-8")


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(render(), content_type=CONTENT_TYPE)
