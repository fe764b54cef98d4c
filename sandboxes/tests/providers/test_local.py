"""The local provider against real processes: bubblewrap, cgroups, execd over HTTP, bash.

Every sandbox here is a real execd process tree; commands run in execd's persistent bash
through ``POST /exec``. Isolated tests check that the provider really isolates and skip
(with the reason) on a host where bubblewrap cannot work, instead of passing unguarded.
Sandbox roots live in a fresh ``/tmp`` directory with mode 0711, not under pytest's
``tmp_path``: its 0700 parents could not be traversed by the sandbox user, so bubblewrap
could not bind the workspace.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import datetime as dt
import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from sandboxes.providers.base import Handle, Provider
from sandboxes.providers.local import LocalProvider, procs, records, validate_image
from sandboxes.providers.local.cgroups import detect as detect_cgroups
from sandboxes.tests.providers.local_support import destroy_all, git, make_spec, probe, run_in
from sandman_site.errors import GuardUnavailable, ProviderConflict, SandboxNotReady, UnknownImage

READY_BUDGET_S = 30.0


@pytest.fixture
def local_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="sandman-test-root-", dir="/tmp"))
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def images_dir(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    images.mkdir()
    return images


@pytest_asyncio.fixture
async def cleanup_root(local_root: Path, images_dir: Path) -> AsyncIterator[Path]:
    """Yields the root; afterwards a fresh provider destroys anything a test left."""
    yield local_root
    sweeper = LocalProvider(root=local_root, images_dir=images_dir, isolation_mode="off")
    await destroy_all(sweeper)
    await sweeper.close()


def _provider(root: Path, images: Path, mode: str, **kwargs: object) -> LocalProvider:
    return LocalProvider(root=root, images_dir=images, isolation_mode=mode, **kwargs)


@pytest_asyncio.fixture
async def isolated(cleanup_root: Path, images_dir: Path) -> AsyncIterator[LocalProvider]:
    provider = _provider(cleanup_root, images_dir, "auto")
    runtime = await provider.runtime()
    if not runtime.isolated:
        pytest.skip(f"bubblewrap cannot isolate sandboxes on this host: {runtime.reason}")
    yield provider
    await destroy_all(provider)
    await provider.close()


@pytest_asyncio.fixture
async def plain(cleanup_root: Path, images_dir: Path) -> AsyncIterator[LocalProvider]:
    provider = _provider(cleanup_root, images_dir, "off")
    yield provider
    await destroy_all(provider)
    await provider.close()


async def _start(provider: LocalProvider, name: str, **overrides: object):
    spec = make_spec(name, **overrides)
    handle = await provider.create(spec)
    info = await provider.wait_ready(handle, READY_BUDGET_S)
    return spec, handle, info


def _alive(pid: int) -> bool:
    return procs.state(pid) not in (None, "Z", "X")


# --- lifecycle and images ------------------------------------------------------------------


@pytest.mark.asyncio
async def test_empty_image_sandbox_runs_bash_over_http_and_destroy_leaves_nothing(
    isolated: LocalProvider,
) -> None:
    assert isinstance(isolated, Provider)
    spec, handle, info = await _start(isolated, "sb-empty")
    assert handle.backend == "local" and handle.ref.startswith("pid:")
    assert info.address.startswith("127.0.0.1:")
    assert set(info.timeline) >= {"api_created", "started", "address_assigned", "ready"}
    assert all(stamp.tzinfo is not None for stamp in info.timeline.values())
    assert info.timeline["started"] <= info.timeline["ready"]
    assert await isolated.health(handle, info.address, spec.token) is True

    answer = await run_in(info.address, spec.token, "cd /workspace && ls -A | wc -l && pwd")
    assert answer["exit_code"] == 0
    assert answer["output"].split() == ["0", "/workspace"]

    pid = int(handle.ref.split(":")[1])
    await isolated.destroy(handle)
    assert not (isolated.root / "sb-empty").exists()
    assert procs.state(pid) is None  # exited AND reaped: no zombie left behind
    assert await isolated.health(handle, info.address, spec.token) is False
    await isolated.destroy(handle)  # already gone is success


@pytest.mark.asyncio
async def test_template_directory_is_copied_and_the_template_is_never_written(
    isolated: LocalProvider, images_dir: Path
) -> None:
    template = images_dir / "python-basic"
    (template / "pkg").mkdir(parents=True)
    (template / "pkg" / "mod.py").write_text("VALUE = 1\n")
    spec, _, info = await _start(isolated, "sb-template", image="python-basic")

    answer = await run_in(
        info.address,
        spec.token,
        "cat pkg/mod.py && echo 'VALUE = 2' > pkg/mod.py && touch new.txt && cat pkg/mod.py",
    )
    assert answer["exit_code"] == 0, answer
    assert answer["output"].split("\n")[:2] == ["VALUE = 1", "VALUE = 2"]
    assert (template / "pkg" / "mod.py").read_text() == "VALUE = 1\n"
    assert not (template / "new.txt").exists()


@pytest.mark.asyncio
async def test_file_url_image_uses_that_absolute_directory(
    isolated: LocalProvider, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "marker.txt").write_text("from a file url\n")
    spec, _, info = await _start(isolated, "sb-fileurl", image=f"file://{elsewhere}")
    answer = await run_in(info.address, spec.token, "cat marker.txt")
    assert answer["output"].strip() == "from a file url"


@pytest.mark.asyncio
async def test_git_template_with_base_commit_gives_a_checkout_at_that_commit(
    isolated: LocalProvider, images_dir: Path
) -> None:
    repo = images_dir / "repo"
    repo.mkdir()
    git(repo, "init", "--quiet")
    (repo / "a.txt").write_text("one\n")
    git(repo, "add", "a.txt")
    git(repo, "commit", "--quiet", "-m", "first")
    first = git(repo, "rev-parse", "HEAD")
    (repo / "a.txt").write_text("two\n")
    (repo / "b.txt").write_text("later\n")
    git(repo, "add", "a.txt", "b.txt")
    git(repo, "commit", "--quiet", "-m", "second")
    second = git(repo, "rev-parse", "HEAD")

    spec, _, info = await _start(isolated, "sb-git", image="repo", base_commit=first[:12])
    answer = await run_in(
        info.address,
        spec.token,
        "cat a.txt; test -e b.txt && echo has-b; git rev-parse HEAD; git status --porcelain",
    )
    assert answer["exit_code"] == 0, answer
    assert answer["output"].split() == ["one", first]
    assert git(repo, "rev-parse", "HEAD") == second  # the template did not move


@pytest.mark.parametrize(
    ("image", "base_commit", "words"),
    [
        ("no-such-image", None, "not a directory"),
        ("file:///nonexistent/sandman/dir", None, "not a directory"),
        ("../escape", None, "not a local image name"),
        ("plain", "abc1234", "not a git repository"),
        ("repo", "0" * 40, "is not in the git repository"),
        ("repo", "--upload-pack=evil", "not a commit name"),
        ("sandman/empty", "abc1234", "needs a git template"),
    ],
)
@pytest.mark.asyncio
async def test_bad_images_raise_unknown_image_before_anything_is_created(
    plain: LocalProvider, images_dir: Path, image: str, base_commit: str | None, words: str
) -> None:
    (images_dir / "plain").mkdir()
    (images_dir / "repo").mkdir()
    git(images_dir / "repo", "init", "--quiet")
    git(images_dir / "repo", "commit", "--quiet", "--allow-empty", "-m", "only")

    with pytest.raises(UnknownImage, match=words):
        validate_image(image, base_commit, images_dir=images_dir)
    with pytest.raises(UnknownImage, match=words):
        await plain.create(make_spec("sb-bad", image=image, base_commit=base_commit))
    assert list(plain.root.iterdir()) == []
    assert await plain.list_owned() == []


def test_validate_image_accepts_the_empty_image_a_template_and_a_known_commit(
    images_dir: Path,
) -> None:
    (images_dir / "team" / "tool").mkdir(parents=True)
    repo = images_dir / "repo"
    repo.mkdir()
    git(repo, "init", "--quiet")
    git(repo, "commit", "--quiet", "--allow-empty", "-m", "only")
    validate_image("sandman/empty", None, images_dir=images_dir)
    validate_image("team/tool", None, images_dir=images_dir)
    validate_image("repo", git(repo, "rev-parse", "HEAD"), images_dir=images_dir)


# --- process lifetime ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "off"])
@pytest.mark.asyncio
async def test_destroy_kills_background_and_setsid_children_started_by_commands(
    cleanup_root: Path, images_dir: Path, mode: str
) -> None:
    provider = _provider(cleanup_root, images_dir, mode)
    runtime = await provider.runtime()
    if mode == "auto" and not runtime.isolated:
        pytest.skip(f"bubblewrap cannot isolate sandboxes on this host: {runtime.reason}")
    spec, handle, info = await _start(provider, f"sb-kill-{mode}")
    # A plain background job, a setsid'd one, and a double-forked orphan of a setsid'd sh.
    base = 4000 + (0 if mode == "off" else 100) + os.getpid() % 50 * 1000
    labels = [str(base + k) for k in (1, 2, 3)]
    command = (
        f"sleep {labels[0]} & "
        f"setsid sleep {labels[1]} < /dev/null > /dev/null 2>&1 & "
        f"( setsid sh -c 'sleep {labels[2]} & exit 0' < /dev/null > /dev/null 2>&1 & ) ; "
        "echo started"
    )
    answer = await run_in(info.address, spec.token, command)
    assert answer["exit_code"] == 0 and "started" in answer["output"], answer

    def sleepers() -> dict[str, int]:
        found = {}
        for entry in os.listdir("/proc"):
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if cmdline[0] == b"sleep" and len(cmdline) > 1 and cmdline[1].decode() in labels:
                if _alive(int(entry)):
                    found[cmdline[1].decode()] = int(entry)
        return found

    deadline = asyncio.get_running_loop().time() + 10
    while len(sleepers()) < 3 and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.01)  # poll an observable state: the orphan's sleep has started
    children = sleepers()
    assert set(children) == set(labels), children

    await provider.destroy(handle)
    for label, pid in children.items():
        assert not _alive(pid), f"sleep {label} (pid {pid}) survived destroy"
    assert not (cleanup_root / spec.name).exists()
    await provider.close()


@pytest.mark.asyncio
async def test_a_second_provider_over_the_same_root_lists_and_destroys_the_first_ones_sandboxes(
    isolated: LocalProvider, images_dir: Path
) -> None:
    first_spec, first, _ = await _start(isolated, "sb-old-a", egress="deny", role="grading")
    second_spec, second, _ = await _start(isolated, "sb-old-b", job_id=9)
    pids = [int(h.ref.split(":")[1]) for h in (first, second)]

    restarted = _provider(isolated.root, images_dir, "auto")
    owned = {o.name: o for o in await restarted.list_owned()}
    assert set(owned) == {"sb-old-a", "sb-old-b"}
    assert owned["sb-old-a"].nonce == first_spec.nonce
    assert owned["sb-old-a"].role == "grading" and owned["sb-old-b"].job_id == 9
    assert {o.phase for o in owned.values()} == {"running"}
    assert all(o.created is not None and o.created.tzinfo for o in owned.values())

    for name in owned:
        await restarted.destroy(Handle(name=name, nonce="", backend="local"))
    assert await restarted.list_owned() == []
    assert [procs.state(pid) for pid in pids] == [None, None]
    await restarted.close()


_ORPHANING_PROVIDER = """
import asyncio, os, sys
from pathlib import Path
from sandboxes.providers.local import LocalProvider
from sandboxes.tests.providers.local_support import make_spec

async def main():
    provider = LocalProvider(root=Path(sys.argv[1]), images_dir=Path(sys.argv[2]),
                             isolation_mode=sys.argv[3])
    handle = await provider.create(make_spec("sb-orphan", egress=sys.argv[4]))
    info = await provider.wait_ready(handle, 30)
    print(info.address, flush=True)
    sys.stdin.read()  # until the test closes our stdin
    os._exit(0)  # die without closing or destroying anything

asyncio.run(main())
"""


@contextlib.contextmanager
def _subreaper() -> Iterator[None]:
    """Orphans of a provider process we kill come back to this test process to be reaped
    (PID 1 on our machines does not reap)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    try:
        yield
    finally:
        libc.prctl(36, 0, 0, 0, 0)
        # bubblewrap's own child, orphaned when bubblewrap died with the provider
        for pid in procs.zombie_children(os.getpid()):
            os.waitpid(pid, 0)


def _live_slirp_children() -> list[int]:
    """slirp4netns processes re-parented to this (subreaper) test process, still running."""
    found = []
    for pid in procs.children(os.getpid()):
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "slirp4netns" and procs.state(pid) not in (None, "Z", "X"):
            found.append(pid)
    return found


@pytest.mark.parametrize(
    ("mode", "egress"), [("auto", "deny"), ("auto", "allow"), ("off", "allow")]
)
@pytest.mark.asyncio
async def test_sandboxes_end_with_the_provider_process_and_a_restarted_one_cleans_up(
    cleanup_root: Path, images_dir: Path, mode: str, egress: str
) -> None:
    restarted = _provider(cleanup_root, images_dir, mode)
    runtime = await restarted.runtime()
    if mode == "auto" and not runtime.isolated:
        pytest.skip(f"bubblewrap cannot isolate sandboxes on this host: {runtime.reason}")
    with _subreaper():
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _ORPHANING_PROVIDER,
            str(cleanup_root),
            str(images_dir),
            mode,
            egress,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[3],
        )
        address = (await child.stdout.readline()).decode().strip()  # type: ignore[union-attr]
        assert address.startswith("127.0.0.1:")
        handle = Handle(name="sb-orphan", nonce="", backend="local")
        assert await restarted.health(handle, address, "") is True
        record = records.read(cleanup_root / "sb-orphan")
        assert record is not None and record.pid
        child.stdin.close()  # type: ignore[union-attr]
        assert await child.wait() == 0

        deadline = asyncio.get_running_loop().time() + 20
        while procs.is_ours(record.pid, record.pid_start):  # observable: its first process ends
            assert asyncio.get_running_loop().time() < deadline, "sandbox outlived its provider"
            await asyncio.sleep(0.02)
        # Then execd: with isolation the first process is bwrap, whose end signals the
        # sandbox's init, which then ends execd; execd holds the host socket itself, so it
        # may answer for a moment after bwrap is gone (seen once under load).
        while await restarted.health(handle, address, ""):
            assert asyncio.get_running_loop().time() < deadline, "execd outlived its provider"
            await asyncio.sleep(0.02)
        while _live_slirp_children():  # allow: slirp4netns ends with its sandbox (exit fd)
            assert asyncio.get_running_loop().time() < deadline, "slirp4netns outlived it"
            await asyncio.sleep(0.02)
        (owned,) = await restarted.list_owned()
        assert (owned.name, owned.phase) == ("sb-orphan", "exited")
        await restarted.destroy(handle)
    assert procs.state(record.pid) is None  # the orphaned first process was reaped
    assert await restarted.list_owned() == []
    assert not (cleanup_root / "sb-orphan").exists()
    await restarted.close()


@pytest.mark.asyncio
async def test_a_name_held_by_another_nonce_is_a_conflict_and_is_left_alone(
    plain: LocalProvider,
) -> None:
    spec, handle, info = await _start(plain, "sb-held")
    with pytest.raises(ProviderConflict):
        await plain.create(make_spec("sb-held", nonce="someone-else"))
    with pytest.raises(ProviderConflict):
        await plain.destroy(Handle(name="sb-held", nonce="someone-else", backend="local"))
    assert await plain.health(handle, info.address, spec.token) is True


@pytest.mark.asyncio
async def test_a_health_check_with_the_sandboxs_token_fails_on_another_sandbox_at_its_address(
    plain: LocalProvider,
) -> None:
    """A dead sandbox's port can be reused by another sandbox's execd: the check sends the
    sandbox's token, and the other execd refuses it, so it is not taken for healthy."""
    spec_a, handle_a, info_a = await _start(plain, "sb-mine")
    spec_b, handle_b, info_b = await _start(plain, "sb-other")
    assert await plain.health(handle_a, info_a.address, spec_a.token) is True
    assert await plain.health(handle_a, info_b.address, spec_a.token) is False
    assert await plain.health(handle_b, info_b.address, spec_b.token) is True


@pytest.mark.asyncio
async def test_a_cancelled_create_settles_and_is_then_destroyed(
    cleanup_root: Path, images_dir: Path
) -> None:
    stamps: list[dt.datetime] = []
    record_written = asyncio.Event()

    def clock() -> dt.datetime:  # called when the record is written, again at spawn
        stamps.append(dt.datetime.now(dt.UTC))
        record_written.set()
        return stamps[-1]

    provider = _provider(cleanup_root, images_dir, "off", clock=clock)
    task = asyncio.ensure_future(provider.create(make_spec("sb-cancelled")))
    await record_written.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await provider.close()  # waits for the create to settle and for its destroy
    assert len(stamps) >= 2, "the create should have run to its spawn"
    assert not (cleanup_root / "sb-cancelled").exists()
    assert await provider.list_owned() == []
    assert procs.marked(provider.host_id("sb-cancelled")) == []


@pytest.mark.asyncio
async def test_execd_that_cannot_start_gives_sandbox_not_ready_and_stays_destroyable(
    cleanup_root: Path, images_dir: Path, tmp_path: Path
) -> None:
    broken = tmp_path / "broken"
    (broken / "execd").mkdir(parents=True)
    (broken / "execd" / "__main__.py").write_text("raise SystemExit('execd refuses: boom')\n")
    provider = _provider(cleanup_root, images_dir, "off", execd_dir=broken)
    handle = await provider.create(make_spec("sb-broken"))
    with pytest.raises(SandboxNotReady, match="boom"):
        await provider.wait_ready(handle, READY_BUDGET_S)
    await provider.destroy(handle)
    assert await provider.list_owned() == []
    await provider.close()


@pytest.mark.asyncio
async def test_wait_ready_with_no_budget_left_raises_sandbox_not_ready(
    plain: LocalProvider,
) -> None:
    handle = await plain.create(make_spec("sb-nobudget"))
    with pytest.raises(SandboxNotReady, match="did not listen"):
        await plain.wait_ready(handle, 0.0)
    await plain.destroy(handle)
    assert not (plain.root / "sb-nobudget").exists()


# --- guards ------------------------------------------------------------------------------


def _host_listener() -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    return listener


def _pending_connection(listener: socket.socket) -> bool:
    try:
        connection, _ = listener.accept()
    except BlockingIOError:
        return False
    connection.close()
    return True


def _host_unix_socket(path: Path) -> socket.socket:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    os.chmod(path, 0o777)
    server.listen(8)
    server.setblocking(False)
    return server


_TCP = "( exec 3<>/dev/tcp/{host}/{port} ) 2>&1 && echo CONNECTED || echo REFUSED"
_UNIX = (
    'python3 -c "import socket,sys; s=socket.socket(socket.AF_UNIX);'
    " s.connect(sys.argv[1]); print('CONNECTED')\" {path} 2>&1 || echo REFUSED"
)


@pytest.mark.asyncio
async def test_egress_denied_sandbox_reaches_neither_host_loopback_nor_host_unix_sockets(
    isolated: LocalProvider, tmp_path: Path
) -> None:
    listener = _host_listener()
    port = listener.getsockname()[1]
    sockets = [
        tmp_path / "db" / ".s.PGSQL.5432",
        Path(f"/run/sandman-test-{os.getpid()}/redis.sock"),
    ]
    servers = [_host_unix_socket(path) for path in sockets]
    try:
        spec, handle, info = await _start(isolated, "sb-deny", egress="deny")
        assert info.guards["net_ns"] is True and info.guards["egress"] == "denied"
        assert await isolated.health(handle, info.address, spec.token) is True
        answer = await run_in(info.address, spec.token, _TCP.format(host="127.0.0.1", port=port))
        assert "REFUSED" in answer["output"] and "CONNECTED" not in answer["output"]
        assert not _pending_connection(listener)
        for path, server in zip(sockets, servers, strict=True):
            answer = await run_in(info.address, spec.token, _UNIX.format(path=path))
            assert "REFUSED" in answer["output"] and "CONNECTED" not in answer["output"]
            assert not _pending_connection(server)
        readings = await probe(info.address, spec.token)
        assert readings["egress"].get("value") != "open", readings["egress"]
        outside = await run_in(info.address, spec.token, _TCP.format(host="192.0.2.1", port=80))
        assert "REFUSED" in outside["output"] and "unreachable" in outside["output"].lower()
    finally:
        listener.close()
        for path, server in zip(sockets, servers, strict=True):
            server.close()
            path.unlink(missing_ok=True)
        os.rmdir(sockets[1].parent)


@pytest.mark.asyncio
async def test_egress_allowed_sandbox_reaches_neither_a_host_loopback_listener_nor_a_unix_socket(
    isolated: LocalProvider, tmp_path: Path
) -> None:
    """``allow`` is the outside world through slirp4netns, never the host (issue 12 item 4;
    the outside is tested in test_local_egress.py)."""
    listener = _host_listener()
    port = listener.getsockname()[1]
    path = tmp_path / "db" / "app.sock"
    server = _host_unix_socket(path)
    try:
        spec, _, info = await _start(isolated, "sb-allow", egress="allow")
        assert info.guards["net_ns"] is True and info.guards["egress"] == "allowed"
        assert info.guards["network"] == "usernet"
        answer = await run_in(info.address, spec.token, _TCP.format(host="127.0.0.1", port=port))
        assert "REFUSED" in answer["output"] and "CONNECTED" not in answer["output"], answer
        assert not _pending_connection(listener)
        answer = await run_in(info.address, spec.token, _UNIX.format(path=path))
        assert "REFUSED" in answer["output"] and not _pending_connection(server)
    finally:
        listener.close()
        server.close()


@pytest.mark.asyncio
async def test_isolated_guards_are_read_from_the_running_sandbox(isolated: LocalProvider) -> None:
    spec, _, info = await _start(isolated, "sb-guards", egress="allow")
    guards = info.guards
    for key in ("user_ns", "mount_ns", "pid_ns", "ipc_ns", "uts_ns"):
        assert guards[key] is True, key
    assert guards["bwrap"] is True and guards["isolation"] == "bwrap"
    assert guards["host_uid"] == 65534 and guards["cap_eff"] == "0000000000000000"
    answer = await run_in(
        info.address,
        spec.token,
        "id -u; cat /etc/shadow > /dev/null 2>&1 && echo SHADOW-READ; "
        "test -e /work && echo HOST-WORK; "
        "cat /run/sandman/token 2>/dev/null; env | grep -c s3cr3t",
    )
    lines = answer["output"].split()
    assert lines[0] == "65534"
    assert "SHADOW-READ" not in lines and "HOST-WORK" not in lines
    assert spec.token not in answer["output"]
    record = records.read(isolated.root / spec.name)
    assert record is not None and record.guards == guards


@pytest.mark.asyncio
async def test_plain_processes_report_every_guard_off(plain: LocalProvider) -> None:
    _, _, info = await _start(plain, "sb-plain")
    guards = info.guards
    assert guards["isolation"] == "off" and guards["bwrap"] is False
    assert not any(guards[k] for k in ("user_ns", "mount_ns", "pid_ns", "net_ns"))
    assert guards["egress"] == "allowed" and guards["host_uid"] == os.geteuid()


@pytest.mark.asyncio
async def test_egress_deny_with_isolation_off_is_refused_with_guard_unavailable(
    plain: LocalProvider,
) -> None:
    with pytest.raises(GuardUnavailable, match="denies egress"):
        await plain.create(make_spec("sb-nodeny", egress="deny"))
    assert list(plain.root.iterdir()) == []


@pytest.mark.asyncio
async def test_require_refuses_to_create_when_bubblewrap_cannot_run(
    cleanup_root: Path, images_dir: Path
) -> None:
    provider = _provider(cleanup_root, images_dir, "require", bwrap="/nonexistent/bwrap")
    with pytest.raises(GuardUnavailable, match="require"):
        await provider.create(make_spec("sb-required"))
    assert await provider.list_owned() == []
    await provider.close()


@pytest.mark.asyncio
async def test_auto_falls_back_to_plain_processes_and_says_why_in_the_guards(
    cleanup_root: Path, images_dir: Path
) -> None:
    provider = _provider(cleanup_root, images_dir, "auto", bwrap="/nonexistent/bwrap")
    _, handle, info = await _start(provider, "sb-fallback")
    assert info.guards["isolation"] == "off" and info.guards["pid_ns"] is False
    assert "bwrap" in str(info.guards["isolation_reason"])
    with pytest.raises(GuardUnavailable):
        await provider.create(make_spec("sb-fallback-deny", egress="deny"))
    await provider.destroy(handle)
    await provider.close()


@pytest.mark.asyncio
async def test_memory_limit_is_recorded_and_a_command_allocating_beyond_it_is_killed(
    isolated: LocalProvider,
) -> None:
    if detect_cgroups() is None:
        pytest.skip("no writable cgroup hierarchy on this host: limits cannot be enforced")
    limit = 160 * 2**20
    spec, handle, info = await _start(isolated, "sb-memory", memory_bytes=limit, cpu_millis=500)
    assert info.guards["memory_limit_bytes"] == limit
    assert info.guards["cpu_quota"] == 0.5
    hog = "python3 -c \"b = b'x' * (600 * 2**20); print('SURVIVED', len(b))\""
    answer = await run_in(info.address, spec.token, hog)
    assert f"SURVIVED {600 * 2**20}" not in answer["output"], answer
    assert answer["exit_code"] == 137, answer  # SIGKILL from the OOM killer
    assert await isolated.health(handle, info.address, spec.token) is True
    readings = await probe(info.address, spec.token)  # what execd reads inside agrees
    assert readings["memory_limit"]["value"] == limit
    assert readings["cpu_quota"]["value"] == 0.5


@pytest.mark.asyncio
async def test_start_up_runs_without_the_cpu_limit_and_the_limit_is_on_before_ready(
    isolated: LocalProvider,
) -> None:
    """A 250m quota made start-up (our code only) 3x slower; commands never run without it."""
    runtime = await isolated.runtime()
    if runtime.cgroups is None or "cpu" not in getattr(runtime.cgroups, "hierarchies", {"cpu": 1}):
        pytest.skip("no cpu cgroup controller on this host: no CPU limit to defer")
    spec = make_spec("sb-cpu-late", cpu_millis=250)
    handle = await isolated.create(spec)
    group = isolated.host_id(spec.name)
    assert runtime.cgroups.cpu_quota(group) is None  # starting: unthrottled
    record = records.read(isolated.root / spec.name)
    assert record is not None and record.cpu_millis_pending == 250
    info = await isolated.wait_ready(handle, READY_BUDGET_S)
    assert runtime.cgroups.cpu_quota(group) == 0.25
    assert info.guards["cpu_quota"] == 0.25
    record = records.read(isolated.root / spec.name)
    assert record is not None and record.cpu_millis_pending is None
    readings = await probe(info.address, spec.token)  # the first command already sees it
    assert readings["cpu_quota"]["value"] == 0.25
    await isolated.destroy(handle)


_MEMORY_SCAN = r"""
import json, os
out = {}
for pid in filter(str.isdigit, os.listdir("/proc")):
    if int(pid) == os.getpid():
        continue
    cmd = pid
    try:
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        maps = open(f"/proc/{pid}/maps").read().splitlines()
        found = False
        with open(f"/proc/{pid}/mem", "rb") as mem:
            for line in maps:
                span, perms = line.split()[:2]
                if "r" not in perms:
                    continue
                lo, hi = (int(x, 16) for x in span.split("-"))
                try:
                    mem.seek(lo)
                    found = found or NEEDLE in mem.read(hi - lo)
                except OSError:
                    pass
        out[pid] = [cmd, "TOKEN" if found else "clean"]
    except OSError as exc:
        out[pid] = [cmd, type(exc).__name__]
print(json.dumps(out))
"""


async def _memory_of_sandbox_processes(provider: LocalProvider, name: str) -> dict[str, list[str]]:
    spec, _, info = await _start(provider, name)
    script = _MEMORY_SCAN.replace("NEEDLE", repr(spec.token.encode()))
    (provider.root / name / "workspace" / "scan.py").write_text(script)
    answer = await run_in(info.address, spec.token, "python3 scan.py")
    assert answer["exit_code"] == 0, answer
    return json.loads(answer["output"])


@pytest.mark.asyncio
async def test_commands_cannot_read_the_token_from_the_memory_of_init_or_execd(
    isolated: LocalProvider,
) -> None:
    """Commands run as the same uid as execd; without PR_SET_DUMPABLE 0 (set by the init,
    inherited by the forked execd) /proc/<pid>/mem would show them the token."""
    readings = await _memory_of_sandbox_processes(isolated, "sb-memory-token")
    # execd is forked from the init (no exec), so both show the init's command line
    holders = [
        verdict
        for cmd, verdict in readings.values()
        if "sandbox_init.py" in cmd and "bwrap" not in cmd.split()[0]
    ]
    assert holders == ["PermissionError", "PermissionError"], readings
    assert "TOKEN" not in [verdict for _, verdict in readings.values()], readings


# --- kept health connections ------------------------------------------------------------------


class _CountingHealth:
    """A stdlib HTTP/1.1 server answering /health with ``body``, counting the connections it
    accepted; ``drop_idle`` closes every connection from the server's side while idle."""

    FULL = {"ok": True, "version": "test", "shell_alive": True}  # execd's declared shape

    def __init__(self, body: dict[str, object] | None = None) -> None:
        import http.server
        import threading

        owner = self
        self.connections = 0
        self.body = json.dumps(self.FULL if body is None else body).encode()
        self.open: list[socket.socket] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                owner.connections += 1
                owner.open.append(self.request)
                super().setup()

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(owner.body)))
                self.end_headers()
                self.wfile.write(owner.body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def drop_idle(self) -> None:
        """The server closes its kept connections (an execd restarted or gone)."""
        for sock in self.open:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.open.clear()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(10)


@pytest.mark.asyncio
async def test_health_checks_reuse_one_kept_connection_and_replace_a_closed_one() -> None:
    from sandboxes.providers.local.health import ExecdHealth

    server = _CountingHealth()
    health = ExecdHealth(timeout_s=10)
    try:
        for _ in range(3):
            assert await health.check("sb-a", server.address) is True
        assert server.connections == 1
        server.drop_idle()  # the kept connection dies while idle
        assert await health.check("sb-a", server.address) is True
        assert server.connections == 2
        assert await health.check("sb-a", server.address) is True
        assert server.connections == 2  # the replacement is kept in turn
    finally:
        await health.close()
        server.stop()


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "body",
    [
        {"ok": True},  # no version, no shell_alive: not the declared shape
        {"ok": "yes", "version": "test", "shell_alive": True},
        {"ok": False, "version": "test", "shell_alive": False},
    ],
)
async def test_a_health_answer_of_an_undeclared_shape_or_not_ok_is_false(
    body: dict[str, object],
) -> None:
    from sandboxes.providers.local.health import ExecdHealth

    server = _CountingHealth(body)
    health = ExecdHealth(timeout_s=10)
    try:
        assert await health.check("sb-a", server.address) is False
    finally:
        await health.close()
        server.stop()


async def _startup_and_env(provider: LocalProvider, name: str) -> None:
    script = "export ACTIVATED=env-1\nactivated() { echo yes; }\n"
    spec, handle, info = await _start(provider, name, startup_script=script)
    answer = await run_in(info.address, spec.token, "activated; echo $ACTIVATED; env")
    lines = answer["output"].splitlines()
    assert lines[:2] == ["yes", "env-1"]
    assert "PATH" in {line.split("=", 1)[0] for line in lines}
    assert not [line for line in lines if line.startswith("SANDMAN")], lines
    await provider.destroy(handle)


@pytest.mark.asyncio
async def test_the_jobs_startup_script_runs_first_and_no_sandman_variable_is_visible(
    isolated: LocalProvider,
) -> None:
    """Issue 14: the job's startup script (``conda activate``'s case) runs in the shell
    before any command; the sandbox's ``SANDMAN_SANDBOX`` marker is execd's, not the
    commands' (``env`` shows no ``SANDMAN_`` name)."""
    await _startup_and_env(isolated, "sb-startup-isolated")


@pytest.mark.asyncio
async def test_the_startup_script_and_hidden_variables_without_isolation(
    plain: LocalProvider,
) -> None:
    await _startup_and_env(plain, "sb-startup-plain")
