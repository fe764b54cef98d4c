"""The database lost right after a chosen COMMIT, for the "no 503 for a stored change" tests.

``dbguard`` promises that a 503 means nothing was stored. A view that queries again after
its service committed (to build the answer) breaks that promise when PostgreSQL goes away
between the two. These context managers place the loss exactly: once a transaction that
ran a matching statement commits, every later query fails the way a dropped connection
does (``OperationalError``).

* :func:`database_lost_after_commit_of` matches a write (``INSERT``/``UPDATE``/``DELETE``)
  to one table; :func:`database_lost_after_commit` takes any predicate over
  ``(sql, params)``.
* With ``every_thread=True`` the loss also reaches connections opened in other threads
  meanwhile (a controller started inside the block, ``sync_to_async`` workers): each new
  connection gets the same wrapper through Django's ``connection_created`` signal.

The state dict says what happened: ``committed`` (the loss began), ``refused`` (queries
that met it), so a test can assert the fault really came after the COMMIT.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import OperationalError, connection
from django.db.backends.signals import connection_created

Predicate = Callable[[str, Any], bool]


def writes_to(table: str) -> Predicate:
    """A predicate matching an INSERT, UPDATE or DELETE of ``table``."""
    verb = r"^\s*(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+"
    pattern = re.compile(rf'{verb}"?{re.escape(table)}"?(?!\w)', re.I)
    return lambda sql, params: bool(pattern.match(sql))


@contextmanager
def database_lost_after_commit(
    when: Predicate, *, every_thread: bool = False
) -> Iterator[dict[str, int]]:
    """Once a transaction that ran a statement matching ``when`` commits, every query fails."""
    state = {"committed": 0, "refused": 0}
    lock = threading.Lock()
    wrapped: list[Any] = []

    def lost() -> None:
        with lock:
            state["committed"] = 1

    def wrapper(execute: Callable[..., Any], sql: str, params: Any, many: bool, ctx: Any) -> Any:
        if state["committed"]:
            with lock:
                state["refused"] += 1
            raise OperationalError("server closed the connection unexpectedly")
        result = execute(sql, params, many, ctx)
        if when(sql, params):
            ctx["connection"].on_commit(lost)  # at once in autocommit mode
        return result

    def attach(sender: Any, connection: Any, **kwargs: Any) -> None:
        connection.execute_wrappers.append(wrapper)
        wrapped.append(connection)

    if every_thread:
        connection_created.connect(attach, weak=False)
    try:
        with connection.execute_wrapper(wrapper):
            yield state
    finally:
        if every_thread:
            connection_created.disconnect(attach)
        for conn in wrapped:
            if wrapper in conn.execute_wrappers:
                conn.execute_wrappers.remove(wrapper)


@contextmanager
def database_lost_after_commit_of(
    table: str, *, every_thread: bool = False
) -> Iterator[dict[str, int]]:
    """Once a transaction that wrote ``table`` commits, every query fails."""
    with database_lost_after_commit(writes_to(table), every_thread=every_thread) as state:
        yield state
