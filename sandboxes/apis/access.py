"""Who may call the hot routes (acquire, release), answered from memory where it can be.

The async views (``sandboxes.apis.asyncview``) must not block the server's event loop on
the database, and a warm acquire should cost no query at all; the ASGI fast path
(``sandboxes.apis.fastpath``) answers only what these maps already know. Three process-local maps
make that possible:

* token key -> user, for ``token_ttl_s()`` (1 s; DRF's ``TokenAuthentication`` reads the
  token row and its user on every request);
* job id -> owner id (a job's owner never changes);
* sandbox id -> job id, remembered when this process hands the sandbox out (never changes).

Invariants a reader must not break:
* The visibility rule is the one of ``sandboxes.selectors`` (a non-staff user sees only
  their own jobs and those jobs' sandboxes; anything else is ``NotFound`` with the same
  sentence, so an id's existence never leaks). Misses are answered BY those selectors.
* Entries are dropped or overwritten by model signals in this process: a token deleted
  or created, any user saved or deleted (deactivation) forget the token map; a job or
  sandbox saved or deleted rewrites its entry (ids reused after a rollback or a reset
  database cannot serve a stale owner). Changes that send no signal here (another
  process's, or a queryset ``update()``) reach this map only through the TTL: such a
  revoked token or deactivated user may still authenticate for less than ``token_ttl_s()``
  (1 s) after the change, in every process. The cost: a busy token is read from the
  database once a second per process, not once a request.
* Misses read the database in the request's own thread (``thread_sensitive``), whose
  connection Django closes (returns to the pool) when the request ends. Concurrent misses
  of one token, or of one job, on one loop share ONE read (a burst's first requests in a
  worker that has not seen the job yet). A job's miss reads its owner
  (``selectors.job_owner_id``) and applies the selectors' rule to it here (``_visible``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models.signals import post_delete, post_save
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token

from sandboxes import selectors
from sandboxes.models import Job, Sandbox
from sandman_site.errors import NotFound

_MAX_ENTRIES = 100_000  # a bound, not a tuning knob: a full map is simply emptied

_tokens: dict[str, tuple[Any, float]] = {}
_reads: dict[str, asyncio.Task[tuple[Any, Any]]] = {}  # token key -> its read under way
_job_owner: dict[int, int] = {}
_owner_reads: dict[int, asyncio.Task[int | None]] = {}  # job id -> its owner's read under way
_sandbox_job: dict[int, int] = {}


def _put(table: dict, key: Any, value: Any) -> None:
    if len(table) >= _MAX_ENTRIES:
        table.clear()
    table[key] = value


def clear() -> None:
    """Forget everything (tests, or after a database reset)."""
    _tokens.clear()
    _job_owner.clear()
    _sandbox_job.clear()


# --- authentication ------------------------------------------------------------------------


def token_ttl_s() -> float:
    """How long a token read from the database is trusted here: ``SANDMAN_API_TOKEN_TTL_S``
    (1 s: issue 13, a token revoked anywhere stops working within 1 s)."""
    return float(settings.SANDMAN_API_TOKEN_TTL_S)


def cached_token_user(key: str, *, clock: Any = time.monotonic) -> Any | None:
    """The user of a token known here and not expired; None otherwise (no query)."""
    hit = _tokens.get(key)
    if hit is not None and hit[1] > clock():
        return hit[0]
    return None


async def token_user(key: str, *, clock: Any = time.monotonic) -> tuple[Any, Any]:
    """(user, token) for a ``Token <key>`` header; ``AuthenticationFailed`` like DRF's.

    Concurrent misses of one key on one loop share ONE read (``_reads``): when the entry
    expires (every ``token_ttl_s()``), a burst's requests would otherwise each read the
    token and its user, one after the other in the request thread. A caller that is
    cancelled leaves the read to the others."""
    user = cached_token_user(key, clock=clock)
    if user is not None:
        return user, key
    loop = asyncio.get_running_loop()
    read = _reads.get(key)
    if read is None or read.done() or read.get_loop() is not loop:
        read = _reads[key] = loop.create_task(_read_token(key, clock))
        read.add_done_callback(functools.partial(_read_done, _reads, key))
    return await asyncio.shield(read)


async def _read_token(key: str, clock: Any) -> tuple[Any, Any]:
    user, token = await sync_to_async(
        TokenAuthentication().authenticate_credentials, thread_sensitive=True
    )(key)
    _put(_tokens, key, (user, clock() + token_ttl_s()))
    return user, token


def _read_done(reads: dict[Any, Any], key: Any, read: asyncio.Task[Any]) -> None:
    if reads.get(key) is read:
        del reads[key]
    if not read.cancelled():
        read.exception()  # retrieved: every waiter may have left (their cancellation)


# --- visibility (the rule of sandboxes.selectors) ------------------------------------------


def _visible(user: Any, owner_id: int) -> bool:
    return bool(getattr(user, "is_staff", False)) or owner_id == user.pk


def job_visible_cached(*, user: Any, job_id: int) -> bool | None:
    """Whether the caller may see the job, from memory; None when unknown here."""
    owner_id = _job_owner.get(job_id)
    return None if owner_id is None else _visible(user, owner_id)


def sandbox_visible_cached(*, user: Any, sandbox_id: int) -> bool | None:
    """Whether the caller may see a sandbox this process handed out; None when unknown."""
    job_id = _sandbox_job.get(sandbox_id)
    return None if job_id is None else job_visible_cached(user=user, job_id=job_id)


async def check_job(*, user: Any, job_id: int) -> None:
    """Return if the caller may use the job; ``NotFound`` otherwise (also for others')."""
    visible = job_visible_cached(user=user, job_id=job_id)
    if visible is None:
        owner_id = await _job_owner_read(job_id)
        visible = owner_id is not None and _visible(user, owner_id)
    if not visible:
        raise NotFound(f"No job {job_id}.")


async def _job_owner_read(job_id: int) -> int | None:
    """The job's owner (None: no such job), read once for every concurrent miss of the
    job on this loop (``_owner_reads``): a job created through another web worker is
    unknown here, and its first burst's acquires would otherwise each read it, one after
    the other in the request thread, before any of them is claimed. A caller that is
    cancelled leaves the read to the others."""
    loop = asyncio.get_running_loop()
    read = _owner_reads.get(job_id)
    if read is None or read.done() or read.get_loop() is not loop:
        read = _owner_reads[job_id] = loop.create_task(_read_owner(job_id))
        read.add_done_callback(functools.partial(_read_done, _owner_reads, job_id))
    return await asyncio.shield(read)


async def _read_owner(job_id: int) -> int | None:
    owner_id = await sync_to_async(selectors.job_owner_id, thread_sensitive=True)(job_id=job_id)
    if owner_id is not None:
        _put(_job_owner, job_id, owner_id)
    return owner_id


async def check_sandbox(*, user: Any, sandbox_id: int) -> None:
    """Return if the caller may use the sandbox; ``NotFound`` otherwise."""
    visible = sandbox_visible_cached(user=user, sandbox_id=sandbox_id)
    if visible is not None:
        if visible:
            return
        raise NotFound(f"No sandbox {sandbox_id}.")
    await sync_to_async(selectors.sandbox_get_for_user, thread_sensitive=True)(
        user=user, sandbox_id=sandbox_id
    )


def remember_sandbox(*, sandbox_id: int, job_id: int) -> None:
    """This process handed the sandbox out for that job: its release needs no query."""
    _put(_sandbox_job, sandbox_id, job_id)


def forget_sandbox(sandbox_id: int) -> None:
    _sandbox_job.pop(sandbox_id, None)


# --- keeping the maps true in this process ---------------------------------------------------


def _token_changed(sender: Any, instance: Token, **kwargs: Any) -> None:
    _tokens.pop(instance.key, None)


def _user_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    _tokens.clear()  # rare (logins stamp last_login), and a deactivation must take effect


def _job_changed(sender: Any, instance: Job, **kwargs: Any) -> None:
    if kwargs.get("signal") is post_delete:
        _job_owner.pop(instance.pk, None)
    else:
        _put(_job_owner, instance.pk, instance.owner_id)


def _sandbox_changed(sender: Any, instance: Sandbox, **kwargs: Any) -> None:
    if kwargs.get("signal") is post_delete or kwargs.get("created"):
        _sandbox_job.pop(instance.pk, None)


for _signal in (post_save, post_delete):
    _signal.connect(_token_changed, sender=Token, dispatch_uid=f"access-token-{id(_signal)}")
    _signal.connect(
        _user_changed, sender=get_user_model(), dispatch_uid=f"access-user-{id(_signal)}"
    )
    _signal.connect(_job_changed, sender=Job, dispatch_uid=f"access-job-{id(_signal)}")
    _signal.connect(_sandbox_changed, sender=Sandbox, dispatch_uid=f"access-sandbox-{id(_signal)}")
