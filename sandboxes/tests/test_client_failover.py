"""The trainer client resends a keyed acquire or release through a failover.

While the replicas fail over, a standby answers ``503 controller_unavailable`` with
``Retry-After`` (its elector's retry period) and a connection can break while the
Service's label moves. The client resends with the same ``Idempotency-Key``, waiting what
``Retry-After`` asks (else its doubling backoff), until ``failover_s`` after the first
failure; anything else, and an unkeyed call, is raised at once. A scripted HTTP server
stands in for the service here (a fake clock: the waits are recorded, not slept); the
two-replica failover is ``sandman_site/tests/test_failover.py``.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from sandboxes.client import Client, Job, SandmanClientError

REFUSED = (503, {"Retry-After": "1"}, {"error": "controller_unavailable", "detail": "standby"})
BROKEN = (0, {}, None)  # the connection closes with no answer
HANDED_OUT = {
    "sandbox_id": 7,
    "name": "sm-1-abc",
    "address": "10.0.0.7:7070",
    "token": "t",
    "source": "new",
    "wait_ms": 1.0,
    "queue_ms": 0.0,
}


class ScriptedService:
    """Answers each request with the next scripted ``(status, headers, body)``; records
    each request's method, path and ``Idempotency-Key``."""

    def __init__(self, script: list[tuple[int, dict[str, str], Any]]) -> None:
        self.script = list(script)
        self.seen: list[tuple[str, str, str | None]] = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                service.seen.append((self.command, self.path, self.headers["Idempotency-Key"]))
                status, headers, body = service.script.pop(0)
                if status == 0:
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                data = json.dumps(body).encode()
                self.send_response(status)
                for name, value in {**headers, "Content-Type": "application/json"}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeTime:
    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(round(seconds, 3))
        self.now += seconds


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def service(request: pytest.FixtureRequest) -> Iterator[ScriptedService]:
    scripted = ScriptedService(request.param)
    yield scripted
    scripted.close()


def client_for(service: ScriptedService, fake: FakeTime, failover_s: float = 60.0) -> Client:
    return Client(service.url, "tok", failover_s=failover_s, clock=fake.clock, sleep=fake.sleep)


def acquire(client: Client) -> Any:
    job = Job(client, {"id": 1, "name": "run"})
    return job.acquire(image="img", spec={"cpu": "1", "memory": "1Gi"})


@pytest.mark.parametrize(
    "service",
    [[REFUSED, (503, {"Retry-After": "2"}, REFUSED[2]), BROKEN, (200, {}, HANDED_OUT)]],
    indirect=True,
)
def test_an_acquire_refused_by_a_standby_then_cut_is_resent_with_its_key_until_it_is_served(
    service: ScriptedService, fake_time: FakeTime
) -> None:
    sandbox = acquire(client_for(service, fake_time))
    assert sandbox.sandbox_id == 7
    assert [s[:2] for s in service.seen] == [("POST", "/api/v1/jobs/1/acquire/")] * 4
    keys = {key for _, _, key in service.seen}
    assert len(keys) == 1 and None not in keys  # one key: the service hands out one sandbox
    # Retry-After as asked (1 s, 2 s); after the broken connection the backoff (3rd: 0.4 s).
    assert fake_time.waits == [1.0, 2.0, 0.4]


@pytest.mark.parametrize("service", [[REFUSED] * 4], indirect=True)
def test_resending_stops_failover_s_after_the_first_failure_with_the_last_refusal(
    service: ScriptedService, fake_time: FakeTime
) -> None:
    client = client_for(service, fake_time, failover_s=2.5)
    with pytest.raises(SandmanClientError) as refused:
        acquire(client)
    assert (refused.value.status, refused.value.code) == (503, "controller_unavailable")
    assert fake_time.waits == [1.0, 1.0, 0.5]  # the last wait is what the deadline left
    assert len(service.seen) == 4


@pytest.mark.parametrize(
    "service",
    [
        [
            (503, {"Retry-After": "1"}, {"error": "database_unavailable", "detail": "down"}),
            REFUSED,
            (200, {}, {"sandbox_id": 7, "released": True}),
        ]
    ],
    indirect=True,
)
def test_other_refusals_and_unkeyed_calls_are_not_resent(
    service: ScriptedService, fake_time: FakeTime
) -> None:
    client = client_for(service, fake_time)
    with pytest.raises(SandmanClientError) as outage:  # not a failover: the caller decides
        acquire(client)
    assert outage.value.code == "database_unavailable"
    with pytest.raises(SandmanClientError) as unkeyed:
        client.get_job(1)
    assert unkeyed.value.code == "controller_unavailable"
    assert len(service.seen) == 2 and service.seen[1][2] is None
    assert fake_time.waits == []
