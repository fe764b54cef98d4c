"""Fixtures for the end-to-end ownership tests: rigs that are always stopped."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from standin.harness.rig import Rig


@pytest.fixture
def make_rig(transactional_db: None) -> Iterator[Callable[..., Rig]]:
    """Start rigs (stand-in + controller on its provider + trainer loop); stop them all."""
    rigs: list[Rig] = []

    def make(**kwargs: Any) -> Rig:
        rig = Rig(**kwargs)
        rigs.append(rig)
        return rig.start()

    try:
        yield make
    finally:
        for rig in reversed(rigs):
            rig.stop()
