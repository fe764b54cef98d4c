"""Schemathesis over every operation of the document, against the real service (issue 12
item 1): examples, coverage, fuzzing and stateful phases, 0 failures.

The service runs as its own daphne process on the test database
(``sandman_site.testing.server``), so the fast path, the middlewares, the error pages and
the controller answer exactly as in production. Bounded: a fixed seed, a few examples per
operation and a time budget (``FUZZ_MAX_TIME_S``), about a minute of CI.

Reproduce by hand: ``schemathesis run http://HOST/api/v1/schema/?format=json
-H 'Authorization: Token KEY' --checks not_a_server_error,status_code_conformance,
content_type_conformance,response_schema_conformance``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes.tests.api_support import make_job, make_user, seed_sandbox
from sandboxes.tests.conftest import destroy_everything_under, sandbox_root  # noqa: F401
from sandman_site.testing.server import ServedProcess

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance"
)
FUZZ_MAX_TIME_S = 60
FUZZ_MAX_EXAMPLES = 15
# An acquire that gets no sandbox within the caller's own ``timeout_s`` answers 504
# ``acquire_timeout`` by design (declared in the document); no other 5xx is accepted.
CONFIG = """
[[operations]]
include-operation-id = "job_acquire"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "504"]
"""


@pytest.fixture
def served(
    transactional_db: None,
    tmp_path: Path,
    sandbox_root: Path,  # noqa: F811
) -> Iterator[tuple[str, str, Path]]:
    """The service with its controller over the local backend in ``sandbox_root``; every
    sandbox it made is destroyed after it stops."""
    user, token = make_user("fuzz-trainer")
    job = make_job(user, name="fuzz-job")
    seed_sandbox(job, hand_out=True)
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        env = {"SANDMAN_SANDBOX_ROOT": str(sandbox_root), "SANDMAN_CONTROLLER_AUTOSTART": "1"}
        server = ServedProcess(env=env, log=sink)
        server.start()
        try:
            yield server.url, token, log
        finally:
            server.stop()
            destroy_everything_under(sandbox_root)


def _schemathesis(
    url: str, token: str, config: Path, *extra: str
) -> subprocess.CompletedProcess[str]:
    config.write_text(CONFIG)
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(config),
        "run",
        f"{url}/api/v1/schema/?format=json",
        "-H",
        f"Authorization: Token {token}",
        "--checks",
        CHECKS,
        "--phases",
        "examples,coverage,fuzzing,stateful",
        "--max-examples",
        str(FUZZ_MAX_EXAMPLES),
        "--max-time",
        str(FUZZ_MAX_TIME_S),
        "--seed",
        "12",
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--no-color",
        "--request-timeout",
        "30",
        *extra,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=FUZZ_MAX_TIME_S * 4)


def test_schemathesis_finds_no_failure_in_any_operation(
    served: tuple[str, str, Path], tmp_path: Path
) -> None:
    url, token, log = served
    result = _schemathesis(url, token, tmp_path / "schemathesis.toml")
    summary = result.stdout[-3000:]
    failures = result.stdout.partition("FAILURES")[2][:12000]
    assert result.returncode == 0, failures + summary + "\n--- server log ---\n" + _errors(log)
    assert "Selected: " in result.stdout and " 0 failures" not in result.stdout
    assert "Traceback" not in log.read_text()
    tested = [line for line in result.stdout.splitlines() if "Tested:" in line]
    print(summary)
    assert tested, summary


def _errors(log: Path) -> str:
    return "\n".join(line for line in log.read_text().splitlines() if "WARNING" not in line)[-4000:]
