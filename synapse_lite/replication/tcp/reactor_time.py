"""What the replication transports need of a clock, typed for mypy.

Twisted's ``IReactorTime`` is a zope interface, which mypy cannot check calls
against without the zope plugin; this structural type is satisfied by the
reactor and by ``twisted.internet.task.Clock`` alike, so tests drive timers with
the latter.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, cast

from twisted.internet.interfaces import IDelayedCall


class ReactorTime(Protocol):
    """The part of ``IReactorTime`` the transports use."""

    def seconds(self) -> float:
        """The current time, in seconds."""

    def callLater(
        self, delay: float, callable: Callable[..., object], *args: object, **kw: object
    ) -> IDelayedCall:
        """Call ``callable(*args, **kw)`` in ``delay`` seconds."""


class _DelayedCall(Protocol):
    def active(self) -> bool: ...

    def cancel(self) -> None: ...


def cancel_call(call: IDelayedCall | None) -> None:
    """Cancel ``call`` if it is still pending; accept None or a spent call."""
    if call is None:
        return
    delayed = cast(_DelayedCall, call)
    if delayed.active():
        delayed.cancel()
