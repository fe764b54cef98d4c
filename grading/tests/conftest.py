"""Fixtures for the grading tests: the sandboxes tests' real controller over the local provider.

``make_controller`` (with ``sandbox_root`` and ``spawner``) is imported from the sandboxes
tests, so every sandbox a grading test starts is destroyed at teardown.
"""

from __future__ import annotations

from sandboxes.tests.conftest import (  # noqa: F401
    make_controller,
    sandbox_root,
    spawner,
)
