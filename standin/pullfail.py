"""Image pulls that fail, as the kubelet runs them: ErrImagePull, then ImagePullBackOff.

A pod plan ``bad_image`` makes the task container's image unpullable (a tag that does not
exist); ``carrier_outage`` does it to the init containers' images (the carrier registry is
down). The kubelet's cycle for such a container (``images/image_manager.go``, messages as
``kubectl describe pod`` shows them):

    Normal  Pulling  Pulling image "x"
    Warning Failed   Failed to pull image "x": rpc error: code = NotFound desc = ...
    Warning Failed   Error: ErrImagePull          (container waiting: ErrImagePull)
    Normal  BackOff  Back-off pulling image "x"
    Warning Failed   Error: ImagePullBackOff      (container waiting: ImagePullBackOff)

then again after the back-off (10 s, doubling up to 300 s). The phase stays Pending; for an
init container ``Initialized`` is False (ContainersNotInitialized). To keep the virtual
clock from running forever the stand-in stops after ``attempts`` pulls; the pod then stays
in ImagePullBackOff until it is deleted. Every step re-reads the pod and stops if it is
gone or replaced (same rule as the kubelet module).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from standin.events import EventLog
from standin.podstatus import image_id, set_condition
from standin.sim import Simulation
from standin.store import Obj

BACKOFF_INITIAL_S, BACKOFF_MAX_S = 10.0, 300.0


def not_found(image: str) -> str:
    ref = image if "/" in image else f"docker.io/library/{image}"
    return (
        f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and'
        f' unpack image "{ref}": failed to resolve reference "{ref}": {ref}: not found'
    )


def unavailable(image: str) -> str:
    host = image.split("/", 1)[0] if "/" in image else "registry-1.docker.io"
    return (
        f'Failed to pull image "{image}": rpc error: code = Unavailable desc = failed to pull'
        f' and unpack image "{image}": failed to do request: Head "https://{host}/v2/": dial'
        " tcp: i/o timeout"
    )


def set_waiting(pod: Obj, name: str, init: bool, reason: str, message: str, when: str) -> None:
    """The container ``name`` waits with ``reason``; the pod stays Pending."""
    st = pod["status"]
    key = "initContainerStatuses" if init else "containerStatuses"
    spec_key = "initContainers" if init else "containers"
    statuses = []
    for c in pod["spec"].get(spec_key) or []:
        state = {"waiting": {"reason": reason, "message": message}} if c["name"] == name else {}
        statuses.append(
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "" if state else image_id(c.get("image", "")),
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": state or {"waiting": {"reason": "PodInitializing"}},
            }
        )
    st[key] = statuses
    if init:
        set_condition(st, "Initialized", False, when, "ContainersNotInitialized")
    set_condition(st, "ContainersReady", False, when, "ContainersNotReady")
    set_condition(st, "Ready", False, when, "ContainersNotReady")


class FailingPull:
    """One container's failing pull cycle, driven on the simulation clock."""

    def __init__(
        self,
        *,
        sim: Simulation,
        events: EventLog,
        current: Callable[[], Obj | None],
        update: Callable[[Callable[[Obj], None]], Obj | None],
        when: Callable[[], str],
        node: str,
        container: dict[str, Any],
        init: bool,
        outage: bool,
        attempts: int = 3,
    ) -> None:
        self.sim, self.events, self.current, self.update, self.when = (
            sim,
            events,
            current,
            update,
            when,
        )
        self.node, self.container, self.init, self.outage = node, container, init, outage
        self.attempts, self.tried = attempts, 0
        kind = "initContainers" if init else "containers"
        self.path = f"spec.{kind}{{{container['name']}}}"

    def start(self) -> None:
        self._pull()

    def _add(self, reason: str, message: str, type: str = "Normal") -> None:
        pod = self.current()
        if pod is not None:
            self.events.add(reason, pod, message, type=type, node=self.node, field_path=self.path)

    def _pull(self) -> None:
        if self.current() is None:
            return
        image, name = self.container.get("image", ""), self.container["name"]
        self.tried += 1
        error = unavailable(image) if self.outage else not_found(image)
        self._add("Pulling", f'Pulling image "{image}"')
        self._add("Failed", error, "Warning")
        self._add("Failed", "Error: ErrImagePull", "Warning")
        when = self.when()
        self.update(lambda p: set_waiting(p, name, self.init, "ErrImagePull", error, when))
        self.sim.after(1.0, self._back_off)

    def _back_off(self) -> None:
        if self.current() is None:
            return
        image, name = self.container.get("image", ""), self.container["name"]
        message = f'Back-off pulling image "{image}"'
        self._add("BackOff", message)
        self._add("Failed", "Error: ImagePullBackOff", "Warning")
        when = self.when()
        self.update(lambda p: set_waiting(p, name, self.init, "ImagePullBackOff", message, when))
        if self.tried < self.attempts:
            delay = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2 ** (self.tried - 1))
            self.sim.after(delay, self._pull)
