"""Start-up wiring: the process-wide controller gets the incidents hooks from one place."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from incidents import detectors
from incidents import services as incident_services
from sandboxes.controller import (
    Controller,
    ControllerHooks,
    get_controller,
    set_controller,
    set_controller_builder,
)
from sandman_site import wiring


@pytest.fixture
def fresh_process() -> Iterator[None]:
    """No installed controller before or after, and the default builder restored."""
    set_controller(None)
    yield
    set_controller(None)
    set_controller_builder(Controller)


def test_install_makes_get_controller_build_a_controller_with_the_incidents_hooks(
    fresh_process: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[str, object]] = []
    monkeypatch.setattr(
        incident_services, "ownerless_pods_found", lambda **kw: calls.append(("ownerless", kw))
    )
    monkeypatch.setattr(detectors, "run_all", lambda **kw: calls.append(("detectors", kw)))

    wiring.install()
    controller = get_controller()
    assert get_controller() is controller and not controller.started  # built, not started
    controller.hooks.ownerless_found(["sm-1-x"], "t")  # type: ignore[arg-type]
    controller.hooks.after_sweep("t")  # type: ignore[arg-type]
    assert calls == [("ownerless", {"names": ["sm-1-x"], "now": "t"}), ("detectors", {"now": "t"})]


def test_without_the_wiring_a_controller_reports_to_nobody(fresh_process: None) -> None:
    assert get_controller().hooks == ControllerHooks()  # the no-op defaults
