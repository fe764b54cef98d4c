"""``served``: the real service in its own daphne process, with a trainer's token.

The process (``sandman_site.testing.server.ServedProcess``) uses the test database (the
fixture needs ``transactional_db``: what the test writes is committed, so the server
sees it) and runs its controller over the local backend in a fresh ``sandbox_root``.
At teardown the process is stopped and every sandbox it made is destroyed.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes.tests.api_support import make_user
from sandboxes.tests.conftest import destroy_everything_under, sandbox_root  # noqa: F401
from sandman_site.testing.server import Served, ServedProcess


@pytest.fixture
def served(
    transactional_db: None,
    tmp_path: Path,
    sandbox_root: Path,  # noqa: F811
) -> Iterator[Served]:
    user, token = make_user("served-trainer")
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        env = {"SANDMAN_SANDBOX_ROOT": str(sandbox_root), "SANDMAN_CONTROLLER_AUTOSTART": "1"}
        server = ServedProcess(env=env, log=sink)
        server.start()
        try:
            yield Served(url=server.url, user=user, token=token, log=log)
        finally:
            server.stop()
            destroy_everything_under(sandbox_root)
