"""Time for the whole process, through the reactor so tests can drive it."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from twisted.internet import defer, task
from twisted.internet.interfaces import IDelayedCall, IReactorTime


class Clock:
    """Milliseconds, delays and loops on an injected reactor (or ``task.Clock``)."""

    def __init__(self, reactor: IReactorTime) -> None:
        self._reactor = reactor

    def time(self) -> float:
        """Seconds since the epoch."""
        return self._reactor.seconds()

    def time_msec(self) -> int:
        """Milliseconds since the epoch."""
        return int(self._reactor.seconds() * 1000)

    def call_later(self, delay: float, callback: Callable[..., Any], *args: Any) -> IDelayedCall:
        return self._reactor.callLater(delay, callback, *args)

    def looping_call(self, callback: Callable[[], Any], interval: float) -> task.LoopingCall:
        """Call ``callback`` every ``interval`` seconds, starting after one interval."""
        call = task.LoopingCall(callback)
        call.clock = self._reactor
        call.start(interval, now=False).addErrback(lambda f: None)
        return call

    async def sleep(self, seconds: float) -> None:
        await task.deferLater(self._reactor, seconds, lambda: None)

    def timeout(self, d: defer.Deferred[Any], seconds: float) -> defer.Deferred[Any]:
        """Fail ``d`` with ``defer.TimeoutError`` unless it fires within ``seconds``."""
        return d.addTimeout(seconds, self._reactor)


class PeriodicTask:
    """Background work run every ``interval`` seconds, the first time after
    one interval; each run (awaited) finishes before the next starts. A
    process's loop (``start``/``stop``, see ``app/services.py``). ``run``
    should not raise: a failure ends the loop."""

    def __init__(
        self, clock: Clock, interval: float, run: Callable[[], Coroutine[Any, Any, object]]
    ) -> None:
        self._clock = clock
        self._interval = interval
        self._run = run
        self._loop: task.LoopingCall | None = None

    def start(self) -> None:
        self._loop = self._clock.looping_call(
            lambda: defer.ensureDeferred(self._run()), self._interval
        )

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
