"""A process's lifecycle: what starts, and what stops in which order.

Every process is one :class:`ProcessService` whose children start in the
order they were added and stop in the reverse order, each stop finishing (or
timing out) before the next begins. The composition root adds them so that
stopping

1. drains the listeners (no new requests; write requests under way finish),
2. stops background loops,
3. records stream positions and sends this process's last rows,
4. tells the presence writer this process's syncs are over (CLEAR_USER_SYNC),
5. closes replication,
6. releases the database,

in that order, in one place.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from twisted.application.service import MultiService, Service
from twisted.internet import defer

from synapse_lite.clock import Clock

logger = logging.getLogger(__name__)

#: Longest one child may take to stop before the next one is stopped anyway.
STOP_STEP_SECONDS = 10.0


class ProcessService(MultiService):
    """Children start in order and stop one after another in reverse order."""

    def __init__(self, clock: Clock, name: str) -> None:
        super().__init__()
        self._clock = clock
        self.setName(name)

    def stopService(self) -> defer.Deferred[None]:
        Service.stopService(self)
        return defer.ensureDeferred(self._stop_children())

    async def _stop_children(self) -> None:
        for child in reversed(list(self)):
            try:
                await self._clock.timeout(defer.maybeDeferred(child.stopService), STOP_STEP_SECONDS)
            except defer.TimeoutError:
                logger.warning(
                    "Stopping %s took over %.0f s; going on", child.name, STOP_STEP_SECONDS
                )
            except Exception:
                logger.exception("Stopping %s failed; going on", child.name)


class CallbackService(Service):
    """A child whose start and stop are plain functions (the stop may be async)."""

    def __init__(
        self,
        name: str,
        start: Callable[[], object] | None = None,
        stop: Callable[[], Awaitable[object] | object] | None = None,
    ) -> None:
        self.setName(name)
        self._start = start
        self._stop = stop

    def startService(self) -> None:
        super().startService()
        if self._start is not None:
            self._start()

    def stopService(self) -> defer.Deferred[Any]:
        super().stopService()
        if self._stop is None:
            return defer.succeed(None)
        return defer.maybeDeferred(self._stop)


class Loop(Protocol):
    """A component with background work (a looping call, timers). ``stop``
    may return a Deferred: the work under way ending (the process waits for
    it, up to :data:`STOP_STEP_SECONDS` for all loops)."""

    def start(self) -> None: ...

    def stop(self) -> defer.Deferred[None] | None: ...


class LoopsService(Service):
    """Starts and stops the background loops of a process's components."""

    def __init__(self, loops: Sequence[Loop]) -> None:
        self.setName("background loops")
        self._loops = list(loops)

    def startService(self) -> None:
        super().startService()
        for loop in self._loops:
            loop.start()

    def stopService(self) -> defer.Deferred[None] | None:
        super().stopService()
        ending: list[defer.Deferred[None]] = []
        for loop in reversed(self._loops):
            try:
                result = loop.stop()
            except Exception:
                logger.exception("Stopping %r failed", loop)
                continue
            if result is not None:
                ending.append(result)
        if not ending:
            return None
        return defer.DeferredList(ending, consumeErrors=True).addCallback(lambda _: None)
