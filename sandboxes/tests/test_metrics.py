"""``GET /metrics`` parses as Prometheus text 0.0.4 and its numbers match the database."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from sandboxes.metrics import CREATE_TO_READY_BUCKETS_S
from sandboxes.models import Acquisition
from sandboxes.states import SandboxState
from sandboxes.tests.api_support import make_job, make_user, seed_sandbox

pytestmark = pytest.mark.django_db

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$"
)
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<val>(?:[^"\\]|\\.)*)"')


def parse(text: str) -> tuple[dict[str, str], dict[tuple[str, frozenset], float]]:
    """Line-by-line exposition parser: ``({family: type}, {(name, labels): value})``."""
    types: dict[str, str] = {}
    samples: dict[tuple[str, frozenset], float] = {}
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ", 3)
            assert kind in {"counter", "gauge", "histogram", "summary", "untyped"}
            types[name] = kind
            continue
        if line.startswith("#"):
            assert line.startswith("# HELP "), line
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        labels = frozenset((m["key"], m["val"]) for m in _LABEL.finditer(match["labels"] or ""))
        key = (match["name"], labels)
        assert key not in samples, f"duplicate sample {key}"
        samples[key] = float(match["value"])
    return types, samples


def test_metrics_is_plain_text_version_0_0_4_and_parses_line_by_line(client):
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    types, samples = parse(response.content.decode())
    assert types == {
        "sandman_creates_total": "counter",
        "sandman_create_to_ready_seconds": "histogram",
        "sandman_acquisitions_total": "counter",
        "sandman_sandboxes": "gauge",
        "sandman_pacer_queue_length": "gauge",
        "sandman_subnet_free_addresses": "gauge",
        "sandman_address_floor": "gauge",
        "sandman_address_floor_reached": "gauge",
    }
    assert samples[("sandman_creates_total", frozenset())] == 0
    assert samples[("sandman_pacer_queue_length", frozenset())] == 0
    for state in SandboxState.values:
        assert samples[("sandman_sandboxes", frozenset({("state", state)}))] == 0


def test_metrics_counts_creates_states_acquisitions_and_buckets_create_to_ready(client):
    user, _ = make_user("m")
    job = make_job(user)
    t0 = timezone.now() - dt.timedelta(minutes=5)
    seed_sandbox(job, ready_after_s=0.04, requested_at=t0)
    seed_sandbox(job, ready_after_s=0.2, requested_at=t0, hand_out=True)
    seed_sandbox(job, ready_after_s=3.0, requested_at=t0)
    seed_sandbox(job, ready_after_s=None, requested_at=t0)
    acquisitions = [("warm", "ok"), ("warm", "ok"), ("created", "ok"), ("", "timeout")]
    for source, outcome in acquisitions + [("", "pending")]:  # an open one is not counted
        Acquisition.objects.create(
            job=job,
            image="sandman/empty",
            key_hash="k",
            outcome=outcome,
            source=source,
            started_at=t0,
        )
    _, samples = parse(client.get("/metrics").content.decode())

    def value(name: str, **labels: str) -> float:
        return samples[(name, frozenset(labels.items()))]

    assert value("sandman_creates_total") == 4
    assert value("sandman_sandboxes", state="ready") == 2
    assert value("sandman_sandboxes", state="in_use") == 1
    assert value("sandman_sandboxes", state="requested") == 1
    assert value("sandman_acquisitions_total", source="warm", outcome="ok") == 2
    assert value("sandman_acquisitions_total", source="created", outcome="ok") == 1
    assert value("sandman_acquisitions_total", source="none", outcome="timeout") == 1
    assert (
        "sandman_acquisitions_total",
        frozenset({("source", "none"), ("outcome", "pending")}),
    ) not in samples

    h = "sandman_create_to_ready_seconds"
    expected = {0.025: 0, 0.05: 1, 0.1: 1, 0.15: 1, 0.25: 2, 2.5: 2, 5.0: 3, 600.0: 3}
    for bound, count in expected.items():
        assert value(f"{h}_bucket", le=_fmt(bound)) == count, bound
    assert value(f"{h}_bucket", le="+Inf") == 3
    assert value(f"{h}_count") == 3
    assert value(f"{h}_sum") == pytest.approx(3.24, abs=1e-3)
    cumulative = [value(f"{h}_bucket", le=_fmt(b)) for b in CREATE_TO_READY_BUCKETS_S]
    assert cumulative == sorted(cumulative)


def _fmt(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


def test_a_scrape_costs_the_same_few_aggregate_queries_however_many_rows(client):
    """One aggregate per family, never a query per row or per sample."""
    with CaptureQueriesContext(connection) as empty:
        client.get("/metrics")
    user, _ = make_user("q")
    job = make_job(user)
    for i in range(6):
        seed_sandbox(job, ready_after_s=0.1 * (i + 1), hand_out=i % 2 == 0)
    with CaptureQueriesContext(connection) as seeded:
        assert client.get("/metrics").status_code == 200
    # One aggregate per family read from the database (creates, histogram, acquisitions,
    # states, latest subnet readings, the floor's last change).
    assert len(seeded.captured_queries) == len(empty.captured_queries) == 6
