"""Redis connections that stay up, for the replication bus.

txredisapi speaks the Redis protocol (AUTH, SELECT, PUBLISH, SUBSCRIBE); this
module keeps its connections up and reports what the bus needs to know:

* :class:`SubscriberConnection` and :class:`PublisherConnection` tell their
  :class:`ConnectionOwner` when they are usable (authenticated, db selected),
  what messages arrive, and when they are lost. They work in bytes, without
  txredisapi's conversion of number-looking replies, so the bus sees each
  message exactly as published.
* :class:`ConnectionFactory` builds them for the transports' ``ClientService``
  (``reconnect.py``), resetting its backoff once a connection is usable:
  connections lost before (Redis refusing AUTH, say) count as failures, so
  a misconfigured password does not become a tight reconnect loop.
* :class:`Keepalive` PINGs a connection every KEEPALIVE_INTERVAL_SECONDS and
  aborts it if Redis does not answer within KEEPALIVE_TIMEOUT_SECONDS, so a
  half-open connection (Redis host gone) is noticed.

We do not use txredisapi's own factories: its lazy connection queues publishes
without bound while Redis is down, fails those in flight when the connection
drops, runs its timers on the global reactor, and gives no hook for
"subscribed" or "lost".
"""

from __future__ import annotations

import logging
import re
from collections import deque
from typing import Any, Protocol

import txredisapi
from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Factory, connectionDone
from twisted.python.failure import Failure

from synapse_lite.replication.tcp.reactor_time import ReactorTime, cancel_call
from synapse_lite.replication.tcp.reconnect import Backoff

logger = logging.getLogger(__name__)

KEEPALIVE_INTERVAL_SECONDS = 30.0
KEEPALIVE_TIMEOUT_SECONDS = 30.0


class ConnectionOwner(Protocol):
    """What the connections report to (the bus) and read their settings from."""

    password: str | None
    dbid: int | None

    def subscriber_ready(self, conn: SubscriberConnection) -> object:
        """The subscriber is usable (authenticated, db selected)."""

    def message_received(self, conn: SubscriberConnection, message: object) -> None:
        """A message arrived on a subscribed channel (bytes, as published)."""

    def read_started(self) -> None:
        """The messages of one read of the subscriber's socket follow."""

    def read_done(self) -> None:
        """The messages of that read have all been handed over."""

    def subscriber_lost(self, conn: SubscriberConnection) -> None:
        """The subscriber connection is gone (a new one will follow)."""

    def publisher_ready(self, conn: PublisherConnection) -> None:
        """The publisher is usable."""

    def publisher_lost(self, conn: PublisherConnection) -> None:
        """The publisher connection is gone; its ``unacked`` are final."""


class Keepalive:
    """PINGs a Redis connection periodically; aborts it if Redis stays silent."""

    def __init__(self, proto: txredisapi.BaseRedisProtocol, clock: ReactorTime) -> None:
        self._proto = proto
        self._clock = clock
        self._next: IDelayedCall | None = None
        self._timeout: IDelayedCall | None = None

    def start(self) -> None:
        self._next = self._clock.callLater(KEEPALIVE_INTERVAL_SECONDS, self._ping)

    def stop(self) -> None:
        cancel_call(self._next)
        cancel_call(self._timeout)

    def _ping(self) -> None:
        self._timeout = self._clock.callLater(KEEPALIVE_TIMEOUT_SECONDS, self._timed_out)
        try:
            d: Deferred[Any] = self._proto.ping()
        except txredisapi.ConnectionError:
            return  # lost already; connectionLost stops us
        # Any answer, even an error, shows Redis is alive.
        d.addBoth(self._answered)

    def _answered(self, result: object) -> None:
        cancel_call(self._timeout)
        if isinstance(result, Failure) and result.check(txredisapi.ConnectionError):
            return
        self.start()

    def _timed_out(self) -> None:
        logger.warning(
            "Redis did not answer a PING in %.0fs: reconnecting", KEEPALIVE_TIMEOUT_SECONDS
        )
        self._proto.transport.abortConnection()


class _PromptParsing:
    """Parse every reply that arrived, at once.

    After each bulk string, txredisapi's line reader hands the bytes that follow
    to the next reactor turn and pauses the transport meanwhile, so a burst of
    N messages costs N turns of the reactor. Here the rest is parsed straight
    away, in a loop rather than by recursion, so a burst of thousands cannot
    exhaust the stack.
    """

    _unparsed = b""
    _parsing = False

    def setLineMode(self, extra: bytes = b"") -> None:
        self.line_mode = 1
        if extra:
            self._unparsed += extra

    def dataReceived(self, data: bytes, unpause: bool = False) -> None:
        if self._parsing:
            self._unparsed += data
            return
        self._parsing = True
        try:
            super().dataReceived(data)  # type: ignore[misc]
            while self._unparsed:
                more, self._unparsed = self._unparsed, b""
                super().dataReceived(more)  # type: ignore[misc]
        finally:
            self._parsing = False


class SubscriberConnection(_PromptParsing, txredisapi.SubscriberProtocol):
    """The subscribing connection: reports readiness, messages and loss."""

    owner: ConnectionOwner

    def connectionMade(self) -> None:
        # txredisapi authenticates and selects the db, then fires whenConnected.
        self.whenConnected().addCallback(self.owner.subscriber_ready).addErrback(_log_failure)
        super().connectionMade().addErrback(_log_failure)

    def dataReceived(self, data: bytes, unpause: bool = False) -> None:
        """One read: its messages reach the owner between ``read_started`` and
        ``read_done`` (the receiver applies their rows together)."""
        if self._parsing:
            super().dataReceived(data, unpause)
            return
        self.owner.read_started()
        try:
            super().dataReceived(data, unpause)
        finally:
            self.owner.read_done()

    def messageReceived(self, pattern: object, channel: object, message: object) -> None:
        self.owner.message_received(self, message)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        super().connectionLost(reason)
        self.owner.subscriber_lost(self)


class PublisherConnection(_PromptParsing, txredisapi.RedisProtocol):
    """The publishing connection: reports readiness and loss."""

    owner: ConnectionOwner
    #: Commands written and not yet acknowledged by Redis, oldest first:
    #: ``(command name, channel, message)``.
    unacked: deque[tuple[str, str, bytes]]

    def connectionMade(self) -> None:
        self.unacked = deque()
        self.whenConnected().addCallback(self.owner.publisher_ready).addErrback(_log_failure)
        super().connectionMade().addErrback(_log_failure)

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        # The base fails every outstanding reply first; unacked is then complete.
        super().connectionLost(reason)
        self.owner.publisher_lost(self)


def _log_failure(failure: Failure) -> None:
    logger.error("Redis replication: unexpected error: %s", failure.getTraceback())


class ConnectionFactory(Factory):
    """Builds one kind of Redis connection for a ClientService, and gives
    txredisapi's protocol the factory attributes it expects."""

    noisy = False
    isLazy = False

    def __init__(
        self,
        owner: ConnectionOwner,
        role: str,
        protocol_class: type[Any],
        backoff: Backoff,
    ) -> None:
        self.owner = owner
        self.role = role
        self.protocol_class = protocol_class
        #: Reset once a connection is usable: connections lost before (refused
        #: AUTH, ...) count as failures.
        self.backoff = backoff

    def buildProtocol(self, addr: object) -> Any:
        # Bytes in and out: we decode (and refuse bad UTF-8) ourselves, and
        # numbers-looking messages must not become ints.
        proto = self.protocol_class(
            None, "strict", None, self.owner.password, self.owner.dbid, False, None
        )
        proto.factory = self
        proto.owner = self.owner
        proto.whenConnected().addCallback(self._usable)
        return proto

    def _usable(self, proto: object) -> None:
        self.backoff.accepted()

    def stopTrying(self) -> None:
        # Called by txredisapi when AUTH or SELECT fails. We keep retrying,
        # with backoff: the error is logged and may be fixed on the Redis side.
        pass

    def connectionError(self, message: str) -> None:
        logger.error("Redis replication %s connection: %s", self.role, message)


def client_name(channel: str, instance_name: str, role: str) -> str:
    """The name a connection gives itself in Redis's CLIENT LIST."""
    # Redis client names may not contain spaces or odd characters.
    return re.sub(r"[^A-Za-z0-9_.:/-]", "_", f"{channel}:{instance_name}:{role}")


async def set_client_name(proto: txredisapi.BaseRedisProtocol, name: str) -> None:
    """Name the connection in CLIENT LIST (best effort: ACLs may forbid it)."""
    try:
        await proto.execute_command("CLIENT", "SETNAME", name)
    except txredisapi.ConnectionError:
        pass
    except Exception as e:
        logger.debug("CLIENT SETNAME %s failed: %s", name, e)
