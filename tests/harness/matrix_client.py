"""A real Matrix client library (matrix-nio, asyncio) driven from trial tests.

nio runs on its own asyncio event loop in a thread; :class:`NioRunner` hands it
coroutines and turns their results into Deferreds the test can await, so the
Twisted reactor (and the test's other HTTP calls) keeps running meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from twisted.internet import defer, reactor

T = TypeVar("T")


class NioRunner:
    """An asyncio loop in a thread, for nio clients."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._clients: list[Any] = []

    def run(self, coro: Coroutine[Any, Any, T]) -> defer.Deferred[T]:
        """Run a coroutine on the nio loop; a Deferred of its result."""
        d: defer.Deferred[T] = defer.Deferred()
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)

        def done(f: Any) -> None:
            error = f.exception()
            if error is not None:
                reactor.callFromThread(d.errback, error)  # type: ignore[attr-defined]
            else:
                reactor.callFromThread(d.callback, f.result())  # type: ignore[attr-defined]

        future.add_done_callback(done)
        return d

    def client(self, homeserver: str, user: str = "", **kwargs: Any) -> defer.Deferred[Any]:
        """An ``nio.AsyncClient``, made on the nio loop."""
        import nio

        async def make() -> Any:
            config = nio.AsyncClientConfig(store_sync_tokens=False, encryption_enabled=False)
            client = nio.AsyncClient(homeserver, user, config=config, **kwargs)
            self._clients.append(client)
            return client

        return self.run(make())

    def call(self, func: Callable[[], Coroutine[Any, Any, T]]) -> defer.Deferred[T]:
        return self.run(func())

    async def close(self) -> None:
        """Close every client and stop the loop."""

        async def close_all() -> None:
            for client in self._clients:
                await client.close()

        try:
            await self.run(close_all())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=5)
