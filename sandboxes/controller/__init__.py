"""The controller facade (agreed contract): ``Controller``, ``AcquireResult``, ``PrewarmKey``,
``ControllerHooks``, ``RemoteController``, ``ControllerRpcServer``, ``get_controller()``,
``current_controller()`` and ``set_controller()``.

``Controller`` (``core``) is a facade: it runs one loop thread and hands each call to a
collaborator built at ``start()`` (``parts``) from one shared ``ControllerState``
(``state``): ``acquire`` / ``warm`` (hand-outs), ``creates`` (owned creates), ``deletes``,
``lifecycle`` (release, prewarm, checked reuse), ``drain``, ``reuse`` (every execd call),
``ownership`` (owners, anchors), ``maintenance``, ``sweep``, ``reconcile`` (start-up),
``tasks`` (owned tasks, the acquire gate), ``runtimes`` / ``runtime`` (per-job books),
``queries`` (reads), ``dbexec`` (ORM off the loop thread), ``hooks`` (what the sweep
reports outward), ``process`` (the process-wide instance), ``rpc`` / ``remote`` (the
controller process's socket, and the facade web worker processes call it through).

Rule a reader must not break: code outside the controller (API, services, commands,
bench) imports these names from this package, never from its modules: the modules' layout
may change, these names do not. Only the controller's own unit tests import a module.
"""

from __future__ import annotations

from sandboxes.controller.core import Controller
from sandboxes.controller.hooks import ControllerHooks
from sandboxes.controller.process import (
    current_controller,
    get_controller,
    set_controller,
    set_controller_builder,
)
from sandboxes.controller.remote import RemoteController
from sandboxes.controller.rpc import ControllerRpcServer
from sandboxes.controller.runtime import AcquireResult, PrewarmKey

__all__ = [
    "AcquireResult",
    "Controller",
    "ControllerHooks",
    "ControllerRpcServer",
    "PrewarmKey",
    "RemoteController",
    "current_controller",
    "get_controller",
    "set_controller",
    "set_controller_builder",
]
