"""Per-name locks of the local backend: one create or destroy at a time per sandbox name.

Rule a reader must not break: an entry lives only while someone holds or waits for it,
so the table never grows with the number of sandboxes ever made.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field


@dataclass
class _NameLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class NameLocks:
    def __init__(self) -> None:
        self._locks: dict[str, _NameLock] = {}

    @contextlib.asynccontextmanager
    async def hold(self, name: str) -> AsyncIterator[None]:
        """One create/destroy at a time per name; the entry goes when nobody holds it."""
        entry = self._locks.setdefault(name, _NameLock())
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                self._locks.pop(name, None)
