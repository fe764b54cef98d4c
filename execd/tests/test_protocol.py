"""execd.protocol: the daemon answers every route in its declared shape, and ``from_json``
refuses an answer of any other shape (naming the route and the field) instead of guessing."""

from typing import Any, Dict, List

import pytest

from execd import protocol, server
from execd.protocol import (
    BaselineAnswer,
    CheckAnswer,
    EnvAnswer,
    ErrorAnswer,
    ExecAnswer,
    HealthAnswer,
    ProbeAnswer,
    ProtocolError,
    ReadAnswer,
    ReadBytesAnswer,
    ResetAnswer,
    RestoreAnswer,
    WriteAnswer,
)


def test_the_server_serves_exactly_the_routes_the_protocol_declares_with_its_auth_rule() -> None:
    assert set(server.ROUTES) == set(protocol.ROUTES)
    for key, route in server.ROUTES.items():
        assert route.auth == protocol.ROUTES[key].auth, key
    assert [k for k, r in protocol.ROUTES.items() if not r.auth] == [("GET", "/health")]


def test_every_route_answers_in_its_declared_shape(execd: Any, client: Any) -> None:
    """One real call per route, parsed with the route's own answer shape."""

    def call(method: str, path: str, body: Any = None) -> Dict[str, Any]:
        status, data = client.request(method, path, body if method == "POST" else None)
        assert status == 200, (method, path, status, data)
        shape = protocol.ROUTES[(method, path)].answer.from_json(data)
        assert shape.to_json() == data, (method, path)  # nothing lost, nothing added
        return data

    assert call("GET", "/health")["ok"] is True
    assert call("POST", "/exec", {"command": "echo hi"})["output"] == "hi\n"
    call("POST", "/files/write", {"path": "a.txt", "content": "x\r\ny"})
    assert call("POST", "/files/read", {"path": "a.txt"})["line_endings"] == "crlf"
    assert call("POST", "/files/read_bytes", {"path": "a.txt"})["size"] == 4
    assert call("POST", "/env", {"set": {"PROTO": "1"}})["env"]["PROTO"] == "1"
    assert call("GET", "/env")["env"]["PROTO"] == "1"
    call("POST", "/state/baseline", {"roots": [execd.workspace]})
    call("POST", "/files/write", {"path": "b.txt", "content": "new"})
    assert call("POST", "/state/check", {})["clean"] is False
    assert call("POST", "/state/restore", {})["clean"] is True
    call("POST", "/reset", {})
    assert "uid" in call("GET", "/probe")["readings"]


def test_an_exec_answer_without_an_error_omits_the_key_and_one_with_it_keeps_it() -> None:
    ok = ExecAnswer(0, "", 0, False, 0, 1.0, False)
    assert "error" not in ok.to_json()
    failed = ok._replace(exit_code=-1, error="the shell died")
    assert ExecAnswer.from_json(failed.to_json()) == failed


@pytest.mark.parametrize(
    "shape, body, field",
    [
        (HealthAnswer, {"ok": True, "version": "0.1.0"}, "shell_alive"),
        (HealthAnswer, {"ok": "yes", "version": "0.1.0", "shell_alive": True}, "ok"),
        (ExecAnswer, {"exit_code": 0, "output": "hi\n"}, "output_bytes"),
        (
            ExecAnswer,
            dict(ExecAnswer(0, "", 0, False, 0, 1.0, False).to_json(), exit_code=True),
            "exit_code",
        ),
        (ReadAnswer, {"text": "hi", "size": 2, "sha256": "0" * 64}, "path"),
        (ReadBytesAnswer, {"path": "/a", "data_b64": "", "size": 0, "sha256": ""}, "content_b64"),
        (WriteAnswer, {"path": "/a", "size": "3", "sha256": ""}, "size"),
        (EnvAnswer, {"env": {"A": 1}}, "env.A"),
        (EnvAnswer, {"A": "1"}, "env"),
        (ResetAnswer, {"killed": [], "survivors": [], "shell_alive": True}, "duration_ms"),
        (BaselineAnswer, {"files": 3}, "repos"),
        (CheckAnswer, {"ok": True}, "clean"),
        (CheckAnswer, {"clean": True, "differences": None, "duration_ms": 1}, "differences"),
        (RestoreAnswer, {"clean": True, "duration_ms": 1.0}, "restored"),
        (ProbeAnswer, {"readings": {"uid": {"value": 0}}}, "readings.uid"),
        (ErrorAnswer, {"code": "busy", "message": "later"}, "error"),
    ],
)
def test_an_answer_of_another_shape_raises_naming_the_route_and_field(
    shape: Any, body: Dict[str, Any], field: str
) -> None:
    with pytest.raises(ProtocolError) as raised:
        shape.from_json(body)
    assert raised.value.field == field
    assert raised.value.route in str(raised.value)


def test_an_answer_that_is_not_an_object_raises() -> None:
    bodies: List[Any] = [None, [], "ok", 1]
    for body in bodies:
        with pytest.raises(ProtocolError, match="not a JSON object") as raised:
            HealthAnswer.from_json(body)
        assert raised.value.route == "GET /health" and raised.value.field == ""


def test_fields_a_newer_execd_adds_are_ignored_and_ints_read_as_floats() -> None:
    got = ResetAnswer.from_json(
        {"killed": [3], "survivors": [], "shell_alive": True, "duration_ms": 2, "new": 1}
    )
    assert got == ResetAnswer([3], [], True, 2.0)
    assert isinstance(got.duration_ms, float)


def test_an_error_answer_keeps_its_route_specific_keys(client: Any) -> None:
    client.post("/files/write", {"path": "c.txt", "content": "one"})
    status, data = client.request(
        "POST", "/files/write", {"path": "c.txt", "content": "two", "expected_sha256": "0" * 64}
    )
    assert status == 409
    err = ErrorAnswer.from_json(data)
    assert err.error == "sha_mismatch" and set(err.extra) == {"current_sha256"}
    assert err.to_json() == data


def test_requests_serialise_without_their_unset_optional_fields() -> None:
    assert protocol.ExecRequest("ls", cwd="/").to_json() == {"command": "ls", "cwd": "/"}
    assert protocol.ReadRequest("a").to_json() == {"path": "a", "start_line": 1}
    assert protocol.EnvRequest().to_json() == {"set": {}, "unset": []}
    assert protocol.StateRequest().to_json() == {}
