"""``GET /metrics``: Prometheus text exposition (format 0.0.4), written by hand.

Every number comes from one aggregate query (``sandboxes.selectors``), never a Python
loop over rows, so a scrape costs the same with ten sandboxes or ten million.
The pacer queue length is read from the controller only if this process started one;
a scrape never builds or starts a controller.

Families (names are a contract with dashboards and alerts: add, never rename):
* ``sandman_creates_total`` counter — sandboxes ever requested (one row per create).
* ``sandman_create_to_ready_seconds`` histogram — ``requested_at`` → ``ready_at``.
* ``sandman_acquisitions_total{source,outcome}`` counter.
* ``sandman_sandboxes{state}`` gauge — every state, zeros included.
* ``sandman_pacer_queue_length`` gauge.
"""

from __future__ import annotations

import math
import sys

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

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


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: dict[str, str]) -> str:
    if not pairs:
        return ""
    inner = ",".join(f'{key}="{_escape(val)}"' for key, val in pairs.items())
    return "{" + inner + "}"


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _family(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]


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


def render() -> str:
    lines: list[str] = []
    lines += _family("sandman_creates_total", "counter", "Sandboxes ever requested.")
    lines.append(f"sandman_creates_total {selectors.sandbox_create_total()}")

    hist = selectors.create_to_ready_histogram(bounds_s=CREATE_TO_READY_BUCKETS_S)
    name = "sandman_create_to_ready_seconds"
    lines += _family(name, "histogram", "Create-to-Ready time (requested to Ready).")
    for bound, count in hist.buckets:
        lines.append(f'{name}_bucket{{le="{_number(bound)}"}} {count}')
    lines.append(f'{name}_bucket{{le="+Inf"}} {hist.count}')
    lines.append(f"{name}_sum {_number(hist.sum_s)}")
    lines.append(f"{name}_count {hist.count}")

    name = "sandman_acquisitions_total"
    lines += _family(name, "counter", "Acquire calls by where the sandbox came from and outcome.")
    for source, outcome, count in selectors.acquisition_counts():
        lines.append(f"{name}{_labels({'source': source or 'none', 'outcome': outcome})} {count}")

    name = "sandman_sandboxes"
    lines += _family(name, "gauge", "Sandboxes by state.")
    states = selectors.sandbox_state_counts()
    for state in SandboxState.values:
        lines.append(f"{name}{_labels({'state': state})} {states.get(state, 0)}")

    name = "sandman_pacer_queue_length"
    lines += _family(name, "gauge", "Creates waiting for a pacing token in this process.")
    lines.append(f"{name} {pacer_queue_length()}")
    return "\n".join(lines) + "\n"


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(render(), content_type=CONTENT_TYPE)
