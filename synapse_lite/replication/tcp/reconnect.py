"""Keeping a replication connection up: one ``ClientService`` policy for both
transports (TCP to the main process, and each Redis connection).

Twisted's ``ClientService`` connects through an endpoint, reconnects when the
connection is lost or cannot be made, and stops (closing the connection) with
the service. The delay before each attempt grows exponentially from
``initial_delay`` to ``max_delay``, jittered by +-20% so many workers do not
reconnect in step. ``ClientService`` counts an attempt as a success once the
connection is made; the transports count one only once the other side has
accepted it (the main process's first PING; Redis's answer to AUTH and
SELECT), so a connection refused after it was made (a wrong secret) does not
become a tight reconnect loop: the :class:`Backoff` resets only then.
"""

from __future__ import annotations

import random
from typing import Any, cast

from twisted.application.internet import ClientService
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.protocol import Factory

from synapse_lite.replication.tcp.reactor_time import ReactorTime


class Backoff:
    """The pause before each reconnection attempt: ``initial_delay`` doubled
    for every failure since the last accepted connection, at most
    ``max_delay``, jittered. A failure is an attempt that could not connect,
    or a connection lost before the transport called :meth:`accepted`."""

    def __init__(self, initial_delay: float, max_delay: float) -> None:
        self.initial_delay = initial_delay
        self.max_delay = max_delay
        #: Failures since the last accepted connection.
        self.failures = 0

    def accepted(self) -> None:
        """The other side accepted a connection: back off from scratch next time."""
        self.failures = 0

    def next_delay(self, attempt: int) -> float:
        """ClientService's retry policy (``attempt`` is its own count, reset
        whenever a connection is made; ours survives until one is accepted)."""
        self.failures += 1
        delay = min(self.initial_delay * 2 ** min(self.failures - 1, 30), self.max_delay)
        return delay * random.uniform(0.8, 1.2)


def reconnecting_service(
    endpoint: IStreamClientEndpoint, factory: Factory, clock: ReactorTime, backoff: Backoff
) -> ClientService:
    """A ClientService keeping one connection of ``factory`` up (see the
    module docstring)."""
    # zope interfaces and our structural ReactorTime defeat mypy here.
    return ClientService(
        endpoint, cast(Any, factory), retryPolicy=backoff.next_delay, clock=cast(Any, clock)
    )
