"""``Idempotency-Key`` on execd's mutating routes (issue 14 item 5): a repeated key gets
the first call's answer instead of running the command again; the table is bounded in
keys and time (a fake clock, no sleeps)."""

import http.client
import json
import os
import threading
import time
from typing import Any, Dict, Tuple

import pytest

from execd import idempotency
from execd.idempotency import KeyTable, Recorded, Ticket
from execd.tests.helpers import TOKEN, Execd
from execd.wire import ApiError

pytestmark = pytest.mark.timeout(60)


def _post(
    execd: Execd, path: str, body: Any, key: str
) -> Tuple[int, Dict[str, str], Dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", execd.port, timeout=30)
    headers = {
        "Authorization": "Bearer " + TOKEN,
        "Content-Type": "application/json",
        "Idempotency-Key": key,
    }
    try:
        conn.request("POST", path, body=json.dumps(body).encode(), headers=headers)
        resp = conn.getresponse()
        data = json.loads(resp.read())
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
    finally:
        conn.close()


def test_a_repeated_key_answers_the_first_calls_answer_without_running_again(
    execd: Execd,
) -> None:
    body = {"command": "echo ran >> counter; wc -l < counter"}
    status, headers, first = _post(execd, "/exec", body, "k-1")
    assert status == 200 and first["output"] == "1\n"
    assert idempotency.REPLAYED.lower() not in headers
    status, headers, again = _post(execd, "/exec", body, "k-1")
    assert status == 200 and again == first
    assert headers[idempotency.REPLAYED.lower()] == "true"
    with open(os.path.join(execd.workspace, "counter")) as f:
        assert f.read() == "ran\n"
    status, _, other = _post(execd, "/exec", body, "k-2")  # a new key runs it again
    assert other["output"] == "2\n"


def test_a_repeat_while_the_first_call_runs_waits_for_its_answer(execd: Execd) -> None:
    gate = os.path.join(execd.workspace, "gate")
    body = {"command": "echo ran >> counter; while [ ! -e gate ]; do sleep 0.01; done; echo end"}
    answers = []  # type: List[Any]
    threads = [
        threading.Thread(target=lambda: answers.append(_post(execd, "/exec", body, "same")))
        for _ in range(2)
    ]
    threads[0].start()
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(execd.workspace, "counter")):
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.01)
    threads[1].start()  # not 409 busy: it waits on the key
    open(gate, "w").close()
    for t in threads:
        t.join(30)
    assert [a[0] for a in answers] == [200, 200]
    assert answers[0][2] == answers[1][2] and answers[0][2]["output"] == "end\n"
    with open(os.path.join(execd.workspace, "counter")) as f:
        assert f.read() == "ran\n"


def test_the_same_key_with_another_request_is_refused(execd: Execd) -> None:
    assert _post(execd, "/exec", {"command": "true"}, "k")[0] == 200
    status, _, err = _post(execd, "/exec", {"command": "false"}, "k")
    assert (status, err["error"]) == (422, "idempotency_key_reused")
    status, _, err = _post(execd, "/env", {"set": {"A": "1"}}, "k")
    assert (status, err["error"]) == (422, "idempotency_key_reused")


def test_a_bad_key_is_a_400_and_runs_nothing(execd: Execd) -> None:
    status, _, err = _post(execd, "/exec", {"command": "touch made"}, "has space")
    assert (status, err["error"]) == (400, "bad_idempotency_key")
    assert not os.path.exists(os.path.join(execd.workspace, "made"))


def test_a_refused_call_leaves_its_key_free_for_the_retry(execd: Execd) -> None:
    client = execd.client()
    gate = os.path.join(execd.workspace, "gate")
    holder = threading.Thread(
        target=client.exec, args=("touch busy; while [ ! -e gate ]; do sleep 0.01; done",)
    )
    holder.start()
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(execd.workspace, "busy")):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    body = {"command": "echo ran >> counter"}
    status, _, err = _post(execd, "/exec", body, "retry-me")
    assert (status, err["error"]) == (409, "busy")
    open(gate, "w").close()
    holder.join(30)
    status, headers, ok = _post(execd, "/exec", body, "retry-me")
    assert status == 200 and idempotency.REPLAYED.lower() not in headers
    with open(os.path.join(execd.workspace, "counter")) as f:
        assert f.read() == "ran\n"
    client.close()


def test_file_writes_honour_the_key_and_reads_ignore_it(execd: Execd) -> None:
    path = os.path.join(execd.workspace, "f.txt")
    assert _post(execd, "/files/write", {"path": "f.txt", "content": "one"}, "w")[0] == 200
    with open(path, "w") as f:
        f.write("changed meanwhile")
    status, headers, _ = _post(execd, "/files/write", {"path": "f.txt", "content": "one"}, "w")
    assert status == 200 and headers[idempotency.REPLAYED.lower()] == "true"
    with open(path) as f:
        assert f.read() == "changed meanwhile"  # the replay did not write again
    status, headers, read = _post(execd, "/files/read", {"path": "f.txt"}, "w")
    assert status == 200 and read["content"] == "changed meanwhile"


# -- the table itself ----------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


FP = ("POST", "/exec", 2, 7)


def _settle(table: KeyTable, key: str, body: bytes = b"{}") -> None:
    ticket = table.begin(key, FP)
    assert isinstance(ticket, Ticket)
    ticket.finish(Recorded(200, "json", body))


def test_a_recorded_answer_is_forgotten_after_its_ttl() -> None:
    clock = FakeClock()
    table = KeyTable(max_keys=10, ttl_s=60.0, clock=clock)
    _settle(table, "a")
    clock.now += 59.0
    assert table.begin("a", FP) == Recorded(200, "json", b"{}")
    clock.now += 2.0
    assert isinstance(table.begin("a", FP), Ticket)  # expired: the key is new again


def test_the_table_keeps_at_most_max_keys_and_forgets_the_oldest_answer() -> None:
    table = KeyTable(max_keys=3, ttl_s=600.0, clock=FakeClock())
    for key in "abc":
        _settle(table, key)
    _settle(table, "d")
    assert len(table) == 3
    assert isinstance(table.begin("a", FP), Ticket)  # the oldest went
    assert isinstance(table.begin("d", FP), Recorded)


def test_the_table_refuses_a_new_key_when_every_key_still_runs() -> None:
    table = KeyTable(max_keys=2, ttl_s=600.0, clock=FakeClock())
    running = [table.begin(k, FP) for k in "ab"]
    with pytest.raises(ApiError) as e:
        table.begin("c", FP)
    assert (e.value.status, e.value.code) == (429, "too_many_keys")
    assert all(isinstance(t, Ticket) for t in running)


def test_recorded_bytes_are_bounded() -> None:
    table = KeyTable(max_keys=100, ttl_s=600.0, max_bytes=10, clock=FakeClock())
    _settle(table, "a", b"123456")
    _settle(table, "b", b"123456")  # 12 bytes > 10: the older answer goes
    assert isinstance(table.begin("a", FP), Ticket)
    assert isinstance(table.begin("b", FP), Recorded)


def test_a_repeated_key_of_a_streamed_call_replays_only_its_final_frame(execd: Execd) -> None:
    from execd import streaming

    body = json.dumps({"command": "echo ran >> counter; echo out", "stream": True}).encode()
    headers = {"Authorization": "Bearer " + TOKEN, "Idempotency-Key": "s-1"}
    answers = []
    for _ in range(2):
        conn = http.client.HTTPConnection("127.0.0.1", execd.port, timeout=30)
        conn.request("POST", "/exec", body=body, headers=headers)
        resp = conn.getresponse()
        events = list(streaming.decode(iter([resp.read()])))
        answers.append((resp.getheader(idempotency.REPLAYED), events))
        conn.close()
    (first_header, first), (again_header, again) = answers
    assert first_header is None and [e.kind for e in first] == ["o", "x"]
    assert again_header == "true" and again == first[-1:]  # the same final frame, no output
    with open(os.path.join(execd.workspace, "counter")) as f:
        assert f.read() == "ran\n"
