"""``LocalProvider``: the embedded default backend. A sandbox is an execd process tree.

Each sandbox gets ``<root>/<name>/`` (see ``records``), a workspace made from its image
(``images``), a cgroup with its memory/CPU/pids limits where the host allows
(``cgroups``), and, where bubblewrap works, its own user, mount, PID, IPC and UTS
namespaces, plus an empty network namespace when the job denies egress (``isolation``).
execd is reached at ``127.0.0.1:PORT``; for an isolated sandbox that port is a socket the
provider binds in the host's namespace and execd accepts on (``execd --listen-fd``, passed
through the sandbox's first process, ``sandbox_init``), since the sandbox's own network
namespace has no route to the host.

Ordering rules (base.py's contract, and what the controller relies on after a restart):
* Memory and pids limits are on from the sandbox's first process; its CPU limit is
  written once execd answers health and BEFORE ``wait_ready`` returns, so start-up (our
  code only: the token, hence any command, reaches nobody before Ready) is not throttled
  and no command ever runs without the limit. A limit that cannot be written fails Ready.
* Images and guards are judged BEFORE anything exists: ``UnknownImage`` and
  ``GuardUnavailable`` leave nothing on disk. An egress-deny job is refused when the
  network namespace cannot be installed: a label alone is not enforcement.
* The record on disk is written before anything is started and removed last, so
  ``list_owned`` of ANY later provider over the same root finds everything to clean, and
  ``destroy`` needs only the name.
* ``create`` runs to settlement: if its caller is cancelled, the create finishes in the
  background and is then destroyed.
* Processes are spawned from the event loop's thread: bubblewrap's --die-with-parent
  follows the spawning THREAD, so a short-lived worker thread would take sandboxes with it.
* ``destroy`` kills everything the sandbox started (PID namespace teardown or the init's
  subreaper sweep, then the cgroup), reaps, removes the cgroup and the directory.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from sandboxes.providers.base import (
    Handle,
    LostSandbox,
    OwnedSandbox,
    OwnerRef,
    ReadyInfo,
    SandboxSpec,
)
from sandboxes.providers.local import cgroups, procs, records
from sandboxes.providers.local.health import ExecdHealth
from sandboxes.providers.local.images import (
    ImageSource,
    chown_tree,
    materialize,
    resolve_image,
    validate_image,
)
from sandboxes.providers.local.locks import NameLocks
from sandboxes.providers.local.readiness import ReadinessWaiter
from sandboxes.providers.local.runtime import MODES, Runtime, detect
from sandboxes.providers.local.spawn import Live, Plan, spawn
from sandboxes.providers.local.teardown import Teardown
from sandman_site.errors import (
    GuardUnavailable,
    InvalidInput,
    ProviderConflict,
    ProviderError,
    UnknownImage,
)

log = logging.getLogger(__name__)

_REPO = Path(__file__).resolve().parents[3]


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class LocalProvider:
    name = "local"

    def __init__(
        self,
        *,
        root: Path,
        images_dir: Path,
        isolation_mode: str = "auto",
        execd_python: str = "python3",
        execd_dir: Path | None = None,
        sandbox_uid: int = 65534,
        sandbox_gid: int = 65534,
        pids_max: int = 4096,
        use_cgroups: bool = True,
        bwrap: str | None = None,
        health_timeout_s: float = 2.0,
        kill_grace_s: float = 3.0,
        clock: Callable[[], dt.datetime] = _utcnow,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if isolation_mode not in MODES:
            raise ValueError(f"isolation must be one of {MODES}, not {isolation_mode!r}")
        self.root = Path(root).absolute()
        self.images_dir = Path(images_dir)
        self.isolation_mode = isolation_mode
        self.execd_python = execd_python
        self.execd_dir = Path(execd_dir) if execd_dir else _REPO
        self.uid, self.gid = sandbox_uid, sandbox_gid
        self.pids_max = pids_max
        self.use_cgroups = use_cgroups
        self.bwrap = bwrap or shutil.which("bwrap")
        self.health_timeout_s = health_timeout_s
        self.kill_grace_s = kill_grace_s
        self._clock = clock
        self._monotonic = monotonic
        self._runtime: Runtime | None = None
        self._runtime_lock = asyncio.Lock()
        self._locks = NameLocks()
        self._live: dict[str, Live] = {}
        self._background: set[asyncio.Future[Any]] = set()
        self._cgroup_prefix = uuid.uuid5(uuid.NAMESPACE_URL, str(self.root)).hex[:8]
        self._execd = ExecdHealth(health_timeout_s)
        self._readiness = ReadinessWaiter(
            root=self.root,
            live=self._live,
            health=self.health,
            runtime=self.runtime,
            host_id=self.host_id,
            clock=clock,
            monotonic=monotonic,
        )
        self._teardown = Teardown(
            root=self.root,
            locks=self._locks,
            live=self._live,
            runtime=self.runtime,
            host_id=self.host_id,
            monotonic=monotonic,
            kill_grace_s=kill_grace_s,
        )

    @classmethod
    def from_settings(cls) -> LocalProvider:
        from django.conf import settings

        return cls(
            root=Path(settings.SANDMAN_SANDBOX_ROOT),
            images_dir=Path(settings.SANDMAN_IMAGES_DIR),
            isolation_mode=settings.SANDMAN_LOCAL_ISOLATION,
            execd_python=settings.SANDMAN_EXECD_PYTHON,
            sandbox_uid=getattr(settings, "SANDMAN_LOCAL_SANDBOX_UID", 65534),
            sandbox_gid=getattr(settings, "SANDMAN_LOCAL_SANDBOX_GID", 65534),
        )

    # --- what this host allows ---------------------------------------------------------

    async def runtime(self) -> Runtime:
        async with self._runtime_lock:
            if self._runtime is None:
                self._runtime = await asyncio.to_thread(
                    detect,
                    mode=self.isolation_mode,
                    bwrap=self.bwrap,
                    uid=self.uid,
                    gid=self.gid,
                    execd_python=self.execd_python,
                    execd_dir=self.execd_dir,
                    root=self.root,
                    use_cgroups=self.use_cgroups,
                )
            return self._runtime

    # --- create ------------------------------------------------------------------------

    async def create(self, spec: SandboxSpec) -> Handle:
        task = asyncio.ensure_future(self._create(spec))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            task.add_done_callback(self._destroy_late_create)
            raise

    def _destroy_late_create(self, task: asyncio.Task[Handle]) -> None:
        if task.cancelled() or task.exception() is not None:
            return
        self._spawn_background(self.destroy(task.result()))

    def _spawn_background(self, coro: Coroutine[object, object, object]) -> None:
        background = asyncio.ensure_future(coro)
        self._background.add(background)
        background.add_done_callback(self._background.discard)

    async def _create(self, spec: SandboxSpec) -> Handle:
        name = records.check_name(spec.name)
        if spec.egress not in ("deny", "allow"):
            raise InvalidInput(f"egress must be 'deny' or 'allow', not {spec.egress!r}")
        runtime = await self.runtime()
        self._refuse_missing_guards(spec, runtime)
        source = await asyncio.to_thread(
            resolve_image, spec.image, spec.base_commit, images_dir=self.images_dir
        )
        directory = self.root / name
        async with self._locks.hold(name):
            try:
                directory.mkdir(mode=0o711)
            except FileExistsError:
                existing = records.read(directory)
                if existing and existing.nonce == spec.nonce and existing.pid:
                    return self._handle(existing, directory)  # a retried create: same one
                raise ProviderConflict(
                    f"A local sandbox named {name!r} already exists "
                    + (
                        "unfinished; destroy it first."
                        if existing and existing.nonce == spec.nonce
                        else "with another nonce."
                    ),
                    {"name": name},
                ) from None
            directory.chmod(0o711)
            record = records.SandboxRecord(
                name=name,
                nonce=spec.nonce,
                uid=uuid.uuid4().hex,
                job_id=spec.job_id,
                role=spec.role,
                image=spec.image,
                base_commit=spec.base_commit,
                egress=spec.egress,
                created=records.stamp(self._clock()),
                isolated=runtime.isolated,
            )
            records.write(directory, record)
            try:
                await self._build_and_start(spec, source, runtime, directory, record)
            except BaseException as exc:
                await asyncio.shield(self._undo(name, directory))
                if isinstance(exc, (OSError, cgroups.CgroupError)):
                    raise ProviderError(
                        f"local create of {name!r} failed: {exc}", {"name": name}
                    ) from exc
                raise
            return self._handle(record, directory)

    def _refuse_missing_guards(self, spec: SandboxSpec, runtime: Runtime) -> None:
        if self.isolation_mode == "require" and not runtime.isolated:
            raise GuardUnavailable(
                f"SANDMAN_LOCAL_ISOLATION=require, but sandboxes cannot be isolated here: "
                f"{runtime.reason}."
            )
        if self.isolation_mode == "require" and runtime.cgroups is None:
            raise GuardUnavailable(
                "SANDMAN_LOCAL_ISOLATION=require, but no writable cgroup hierarchy exists "
                "for memory and CPU limits."
            )
        if spec.egress == "deny" and not runtime.isolated:
            raise GuardUnavailable(
                "The job denies egress, but this host cannot give the sandbox its own network "
                f"namespace ({runtime.reason}); refusing rather than running it unguarded."
            )
        if spec.egress != "deny" and runtime.isolated and runtime.usernet is None:
            raise GuardUnavailable(
                "The job allows egress, but slirp4netns is not installed: without it an "
                "isolated sandbox would have no network (and the host's is not offered)."
            )
        if not (self.execd_dir / "execd" / "__main__.py").is_file():
            raise ProviderError(f"execd is not installed at {self.execd_dir / 'execd'}.")

    async def _build_and_start(
        self,
        spec: SandboxSpec,
        source: ImageSource,
        runtime: Runtime,
        directory: Path,
        record: records.SandboxRecord,
    ) -> None:
        private = directory / "private"
        private.mkdir(mode=0o700)
        workspace = directory / "workspace"
        await asyncio.to_thread(self._prepare_workspace, source, workspace, runtime.isolated)
        placement = None
        if runtime.cgroups is not None:
            # No CPU limit yet: start-up runs only our code and is CPU-bound (a 250m quota
            # made it 3x slower); wait_ready writes the limit before the sandbox is Ready.
            limits = cgroups.Limits(spec.memory_bytes or None, None, self.pids_max)
            placement = await asyncio.to_thread(
                self._make_cgroup, runtime.cgroups, spec.name, limits
            )
            record.cpu_millis_pending = spec.cpu_millis or None
        record.cgroup = placement.version if placement else ""
        record.guards = self._declared_guards(spec, runtime, placement)
        plan = Plan(
            runtime=runtime,
            directory=directory,
            placement=placement,
            bwrap=self.bwrap or "bwrap",
            uid=self.uid,
            gid=self.gid,
            execd_dir=self.execd_dir,
            marker=self.host_id(spec.name),
        )
        launched = self._spawn(spec, plan)
        self._live[spec.name] = launched
        record.pid = launched.popen.pid
        record.pid_start = procs.start_time(launched.popen.pid)
        record.timeline = {k: records.stamp(v) for k, v in launched.timeline.items()}
        records.write(directory, record)

    def _spawn(self, spec: SandboxSpec, plan: Plan) -> Live:
        """The one place a sandbox process starts, in the calling (the loop's) thread.

        A sandbox lives as long as the thread that spawned it (--die-with-parent); tests
        that need sandboxes to outlive a controller override this to spawn elsewhere.
        """
        return spawn(spec, plan, self._clock())

    def _prepare_workspace(self, source: ImageSource, workspace: Path, isolated: bool) -> None:
        materialize(source, workspace)
        if isolated and os.geteuid() == 0:
            chown_tree(workspace, self.uid, self.gid)

    def host_id(self, name: str) -> str:
        """The sandbox's name made unique on this host (two roots may reuse a name): its
        cgroup's name and the ``SANDMAN_SANDBOX`` marker in its processes' environment."""
        return f"{self._cgroup_prefix}-{name}"

    def _make_cgroup(
        self, driver: cgroups.CgroupDriver, name: str, limits: cgroups.Limits
    ) -> cgroups.Placement:
        group = self.host_id(name)
        try:
            return driver.create(group, limits)
        except FileExistsError:
            # Left by a crash between create and destroy of an earlier sandbox of this name.
            driver.kill(group)
            driver.remove(group)
            return driver.create(group, limits)

    def _declared_guards(
        self, spec: SandboxSpec, runtime: Runtime, placement: cgroups.Placement | None
    ) -> dict[str, object]:
        guards: dict[str, object] = {
            "isolation": "bwrap" if runtime.isolated else "off",
            "bwrap": runtime.isolated,
            "uid": self.uid if runtime.isolated else os.geteuid(),
            "cap_drop": "ALL" if runtime.isolated else None,
            "egress": "denied" if spec.egress == "deny" else "allowed",
            "network": "none"
            if spec.egress == "deny"
            else ("usernet" if runtime.isolated else "host"),
            "cgroup": placement.version if placement else None,
            "workspace_limit_bytes": None,  # no quota on the local backend
        }
        if not runtime.isolated:
            guards["isolation_reason"] = runtime.reason
        if placement is not None:
            guards.update(placement.applied)
        return guards

    def _handle(self, record: records.SandboxRecord, directory: Path) -> Handle:
        return Handle(
            name=record.name,
            nonce=record.nonce,
            backend=self.name,
            uid=record.uid,
            ref=f"pid:{record.pid}:{directory}",
        )

    # --- ready and health ----------------------------------------------------------------

    async def wait_ready(self, handle: Handle, budget_s: float) -> ReadyInfo:
        return await self._readiness.wait_ready(handle, budget_s)

    async def health(self, handle: Handle, address: str, token: str) -> bool:
        return await self._execd.check(handle.name, address, token)

    # --- destroy, list, close -------------------------------------------------------------

    async def destroy(self, handle: Handle) -> None:
        await self._teardown.destroy(handle)

    async def _undo(self, name: str, directory: Path) -> None:
        await self._teardown.tear_down(name, directory, records.read(directory))

    async def list_owned(self) -> list[OwnedSandbox]:
        return await asyncio.to_thread(self._list_owned)

    def _list_owned(self) -> list[OwnedSandbox]:
        if not self.root.is_dir():
            return []
        owned = []
        for entry in sorted(self.root.iterdir()):
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            record = records.read(entry)
            if record is None:
                continue
            if procs.is_ours(record.pid, record.pid_start):
                phase = "running"
            else:
                phase = "creating" if record.pid is None else "exited"
            owned.append(
                OwnedSandbox(
                    name=record.name,
                    uid=record.uid,
                    nonce=record.nonce,
                    job_id=record.job_id,
                    role=record.role,
                    phase=phase,
                    created=record.created_at,
                )
            )
        return owned

    async def close(self) -> None:
        """Finish background destroys; close ready pipes. Sandboxes keep running."""
        while self._background:  # a settling create may add its destroy
            await asyncio.gather(*list(self._background), return_exceptions=True)
        await self._execd.close()
        for live in self._live.values():
            if live.ready_fd is not None:
                os.close(live.ready_fd)
                live.ready_fd = None
            if live.usernet_exit is not None:
                os.close(live.usernet_exit)
                live.usernet_exit = None
        self._live.clear()

    # --- the rest of the Provider protocol: no owners, no anchors, no pending set ----------

    async def owner_for(self, job_id: int, trainer: OwnerRef | None) -> OwnerRef | None:
        """Local sandboxes have no owner references: ``trainer`` is returned unused."""
        return trainer

    async def delete_anchor(self, job_id: int) -> None:
        """No anchors on this backend."""

    async def list_anchors(self) -> list[int]:
        """No anchors on this backend."""
        return []

    async def flush_pending(self) -> int:
        """Deletes here run to confirmation in ``destroy``: nothing is left pending."""
        return 0

    def take_lost(self) -> list[LostSandbox]:
        """A local sandbox dies with its process, which its holder sees at once: none."""
        return []

    def listen_lost(self, callback: Callable[[], None]) -> None:
        """Nothing to tell: ``take_lost`` is always empty here."""

    def lost_now(self, name: str, uid: str) -> LostSandbox | None:
        """Never: a dead local sandbox fails its health check."""
        return None

    def check_image(self, image: str, base_commit: str | None) -> bool | None:
        """True if a create with this image would start; False if it would be refused."""
        try:
            validate_image(image, base_commit, images_dir=self.images_dir)
        except UnknownImage:
            return False
        return True
