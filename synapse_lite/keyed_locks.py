"""One lock per key (a room, a user), held across awaits on the reactor."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from twisted.internet import defer


class KeyedLocks:
    """One :class:`~twisted.internet.defer.DeferredLock` per key, made when
    the first holder comes and dropped when the last one leaves (so a key
    nobody holds costs nothing). Holders of one key go one at a time, in the
    order they came; different keys do not wait for each other."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[defer.DeferredLock, int]] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (defer.DeferredLock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            await lock.acquire()
            try:
                yield
            finally:
                lock.release()
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
