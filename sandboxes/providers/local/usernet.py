"""User-mode networking for egress-allowed local sandboxes: the outside world, not the host.

Every isolated sandbox gets its own network namespace (bubblewrap ``--unshare-net``);
execd is reached through a listening socket bound in the host's namespace, which it
accepts on itself (see ``sandbox_init.py``). A sandbox whose job allows egress then gets
slirp4netns attached to that namespace: a TAP device (10.0.2.100/24, gateway 10.0.2.2,
DNS 10.0.2.3) whose traffic slirp4netns re-issues as ordinary sockets from the host's
network namespace.

What that means for the host: the sandbox's own ``127.0.0.1`` is its namespace's loopback,
not the host's, and ``--disable-host-loopback`` makes slirp4netns refuse connections to
the host's loopback through the gateway (10.0.2.2) too, so PostgreSQL, Redis and
Sandman's own API on the host's 127.0.0.1 are out of reach. Host unix sockets were never
mounted in. slirp4netns also runs ``--enable-sandbox --enable-seccomp`` (its own empty
mount namespace, capabilities dropped, a syscall filter).

Lifecycle invariants:
* slirp4netns is attached only after execd reported ``listening on`` (bubblewrap has
  finished setting up the namespace's loopback by then; attached earlier the two race on
  netlink and bubblewrap fails), and the sandbox is not Ready before slirp4netns said the
  network is configured (its ready fd).
* It exits when the sandbox does: its ``--exit-fd`` is the read end of a pipe whose only
  write ends live in the sandbox's first processes (passed at spawn, closed here in the
  provider), so the last of them exiting, killed or not, ends slirp4netns. The provider
  is its parent and reaps it in teardown.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from collections.abc import Callable

CIDR = "10.0.2.0/24"  # slirp4netns's default: the sandbox is 10.0.2.100
_STOP_S = 5.0
_POLL_S = 0.005


def find(path: str | None = None) -> str | None:
    """The slirp4netns binary, if it is installed and runs."""
    found = path or shutil.which("slirp4netns")
    if not found:
        return None
    try:
        done = subprocess.run([found, "--version"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return found if done.returncode == 0 else None


def argv(slirp: str, pid: int, ready_fd: int, exit_fd: int) -> list[str]:
    return [
        slirp,
        "--configure",
        "--mtu=65520",
        "--disable-host-loopback",
        "--enable-sandbox",
        "--enable-seccomp",
        f"--cidr={CIDR}",
        f"--ready-fd={ready_fd}",
        f"--exit-fd={exit_fd}",
        # By path, not by pid: given a pid, slirp4netns first joins the pid's user
        # namespace, and from inside it may no longer enter the network namespace (EPERM).
        "--netns-type=path",
        f"/proc/{pid}/ns/net",
        "tap0",
    ]


async def attach(
    slirp: str, pid: int, exit_fd: int, log_path: str, budget_s: float
) -> subprocess.Popen[bytes]:
    """Start slirp4netns on ``pid``'s network namespace; return once it is configured.

    ``exit_fd`` (the read end of the exit pipe) is handed over and closed here. Raises
    ``OSError`` (slirp4netns is killed and reaped first) when it does not get ready within
    ``budget_s``.
    """
    ready_r, ready_w = os.pipe()
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        popen = subprocess.Popen(
            argv(slirp, pid, ready_w, exit_fd),
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            pass_fds=(ready_w, exit_fd),
            start_new_session=True,
        )
    except BaseException:
        os.close(ready_r)
        raise
    finally:
        for fd in (ready_w, exit_fd, log_fd):
            os.close(fd)
    try:
        await _wait_ready(ready_r, budget_s, popen.poll)
    except OSError as exc:
        await stop(popen)
        raise OSError(f"{exc}: {_tail(log_path)}") from exc
    except BaseException:
        await stop(popen)
        raise
    finally:
        os.close(ready_r)
    return popen


def _tail(path: str, limit: int = 400) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read()[-limit:].decode("utf-8", "replace").strip()
    except OSError:
        return ""


async def _wait_ready(fd: int, budget_s: float, poll: Callable[[], int | None]) -> None:
    """slirp4netns writes "1" on its ready fd once the TAP device is configured."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[bytes] = loop.create_future()

    def readable() -> None:
        try:
            chunk = os.read(fd, 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not done.done():
            done.set_result(chunk)

    os.set_blocking(fd, False)
    loop.add_reader(fd, readable)
    try:
        chunk = await asyncio.wait_for(done, max(budget_s, 0.0))
    except TimeoutError:
        raise OSError(f"slirp4netns did not configure the network within {budget_s:g} s") from None
    finally:
        loop.remove_reader(fd)
    if not chunk.startswith(b"1"):
        raise OSError(f"slirp4netns exited before configuring the network (code {poll()})")


async def stop(popen: subprocess.Popen[bytes]) -> None:
    """Reap slirp4netns: it exits by itself once the sandbox is gone; kill it if not."""
    end = asyncio.get_running_loop().time() + _STOP_S
    while popen.poll() is None:
        if asyncio.get_running_loop().time() >= end:
            popen.kill()
            await asyncio.to_thread(popen.wait)
            return
        await asyncio.sleep(_POLL_S)
