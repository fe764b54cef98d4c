"""The watch decoder (providers/kubernetes/fastjson.py): orjson when installed, else json,
giving the same tree for what an API server sends."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sandboxes.providers.kubernetes import fastjson

EVENT = json.dumps(
    {
        "type": "MODIFIED",
        "object": {
            "kind": "Pod",
            "metadata": {
                "name": "sb-1",
                "resourceVersion": "123",
                "annotations": {"sandman.dev/nonce": "n\u00e9\u2603"},
                "labels": {},
            },
            "spec": {"containers": [{"name": "execd", "resources": {"limits": {"cpu": "500m"}}}]},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "restartCount": 0, "ratio": 0.5,
                       "conditions": [{"type": "Ready", "status": "True"}], "x": None, "ok": True},
        },
    }
)  # fmt: skip


@pytest.mark.parametrize("line", [EVENT, EVENT.encode()])
def test_the_fast_decoder_gives_what_json_gives(line: str | bytes) -> None:
    got = fastjson.loads(line)
    assert got == json.loads(line)
    assert type(got["object"]["status"]["ratio"]) is float
    assert got["object"]["metadata"]["annotations"]["sandman.dev/nonce"] == "n\u00e9\u2603"


def test_bad_json_raises_a_value_error_the_reflector_catches() -> None:
    with pytest.raises(ValueError):
        fastjson.loads('{"type": "ADDED", "object": ')


def test_sandman_no_orjson_forces_the_standard_library() -> None:
    code = (
        "import json; from sandboxes.providers.kubernetes import fastjson as f; "
        "print(f.DECODER, f.loads is json.loads)"
    )
    env = {**os.environ, "SANDMAN_NO_ORJSON": "1"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["json", "True"]


def test_the_test_environment_decodes_with_orjson() -> None:
    """The test command installs the ``fast`` extra (scripts/setup.sh), so the decoder the
    provider tests exercise is orjson; the fallback is checked above."""
    assert fastjson.DECODER == "orjson"
