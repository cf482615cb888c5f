"""Kept-alive connections from the router to the processes behind it.

A :class:`BackendConnection` carries one exchange at a time: it writes what
the exchange sends, parses the response's head and frames its body (relayed
unparsed), and comes back to :class:`BackendPool` when the response ends
cleanly. A connection taken from the pool may have been closed by its
process meanwhile (a restart): its loss before any answer says nothing about
the process as it is now (``reused``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from twisted.internet import defer, protocol
from twisted.python.failure import Failure

from synapse_lite.http.tls import InternalTlsClient
from synapse_lite.replication.http.calls import set_tcp_nodelay
from synapse_lite.routing.backends import Backend
from synapse_lite.routing.http1 import (
    MAX_HEAD_BYTES,
    BadMessage,
    Framing,
    UntilClose,
    connection_tokens,
    parse_response_head,
    response_framing,
)
from synapse_lite.sockets import write_now

if TYPE_CHECKING:
    from synapse_lite.routing.exchange import Exchange
    from synapse_lite.routing.relay import ClientConnection

logger = logging.getLogger(__name__)

#: Connecting to a process fails after this long.
CONNECT_TIMEOUT_SECONDS = 2.0
#: Idle connections kept to each process.
MAX_IDLE_PER_BACKEND = 32


class BackendConnection(protocol.Protocol):
    """A kept-alive connection to one process, carrying one exchange at a time."""

    #: A TCP (or TLS) transport: a producer and a consumer.
    transport: Any

    def __init__(self, pool: BackendPool, backend: Backend) -> None:
        self.pool = pool
        self.backend = backend
        self.exchange: Exchange | None = None
        self._buffer = bytearray()
        self._framing: Framing | None = None
        self._streaming_from: ClientConnection | None = None
        self._streaming_to: ClientConnection | None = None
        self._reusable = True
        self.connected = False
        #: Taken from the idle pool: it may have been closed by the process
        #: meanwhile (a restart), which says nothing of the process now.
        self.reused = False

    def connectionMade(self) -> None:
        assert self.transport is not None
        set_tcp_nodelay(self.transport)
        self.connected = True

    # Used by the exchange

    def attach(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self._buffer.clear()
        self._framing = None

    def detach(self) -> None:
        self.exchange = None
        self._unregister()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            write_now(self.transport, data)

    def stream_from(self, client: ClientConnection) -> None:
        """Pause ``client`` while this socket's buffer is full."""
        if self.transport is not None and client.transport is not None:
            self._streaming_from = client
            self.transport.registerProducer(client.transport, True)

    def stop_streaming(self) -> None:
        client, self._streaming_from = self._streaming_from, None
        if client is None:
            return
        if self.transport is not None:
            self.transport.unregisterProducer()
        # Unregistering leaves the client paused if this socket had paused it.
        if client.transport is not None and not client.paused and not client.closing:
            client.transport.resumeProducing()

    def stream_to(self, client: ClientConnection) -> None:
        """Pause this socket while ``client``'s buffer is full."""
        if self.transport is not None and client.transport is not None:
            self._streaming_to = client
            client.transport.registerProducer(self.transport, True)

    def _unregister(self) -> None:
        self.stop_streaming()
        client, self._streaming_to = self._streaming_to, None
        if client is not None and client.transport is not None:
            client.transport.unregisterProducer()
            if self.transport is not None:
                self.transport.resumeProducing()

    def close(self) -> None:
        self._unregister()
        if self.transport is not None:
            self.transport.loseConnection()

    def abort(self) -> None:
        self._unregister()
        if self.transport is not None:
            self.transport.abortConnection()

    # From the process

    def dataReceived(self, data: bytes) -> None:
        if self.exchange is None:
            # Nothing was asked: a confused process. Do not reuse it.
            self.abort()
            return
        self._buffer += data
        # What this read gives the client (a head and the body after it,
        # usually) leaves in one write.
        holding = self.exchange
        holding.hold_output()
        try:
            self._parse()
        except BadMessage as e:
            logger.warning("%s: %s", self.backend.name, e.reason)
            exchange = self.exchange
            self.abort()
            if exchange is not None:
                exchange.backend_lost(e.reason)
        finally:
            holding.release_output()

    def _parse(self) -> None:
        while self.exchange is not None and self._buffer:
            exchange = self.exchange
            if self._framing is None:
                end = self._buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(self._buffer) > MAX_HEAD_BYTES:
                        raise BadMessage(502, "the process sent a response head too large")
                    return
                head = parse_response_head(bytes(self._buffer[:end]))
                del self._buffer[: end + 4]
                if 100 <= head.status < 200:
                    if head.status == 101:
                        raise BadMessage(502, "the process switched protocols")
                    exchange.interim(head)
                    continue
                self._framing = response_framing(exchange.head.method, head)
                exchange.response_head(head, self._framing)
                self._reusable = b"close" not in connection_tokens(head.headers)
            else:
                taken = self._framing.feed(self._buffer)
                chunk = bytes(self._buffer[:taken])
                del self._buffer[:taken]
                exchange.response_data(chunk)
                if taken == 0 and not self._framing.complete:
                    return
            if self._framing is not None and self._framing.complete:
                # Bytes after a complete response: the process is confused.
                reusable = self._reusable and not self._buffer
                self.exchange = None
                self._unregister()
                exchange.response_done(reusable)
                return

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.connected = False
        exchange, self.exchange = self.exchange, None
        self._streaming_from = None
        client, self._streaming_to = self._streaming_to, None
        if client is not None and client.transport is not None:
            client.transport.unregisterProducer()
        self.pool.forget(self)
        if exchange is None:
            return
        if isinstance(self._framing, UntilClose):
            exchange.response_done(False)  # a response that ends with the connection
            return
        message = reason.getErrorMessage() if reason is not None else "connection lost"
        exchange.backend_lost(message, stale=self.reused and self._framing is None)


class BackendPool:
    """Kept-alive connections to each process, made on demand."""

    def __init__(self, reactor: Any, tls: InternalTlsClient) -> None:
        self._reactor = reactor
        self._tls = tls
        self._idle: dict[str, list[BackendConnection]] = {}
        self._all: set[BackendConnection] = set()

    def acquire(self, backend: Backend) -> BackendConnection | defer.Deferred[Any]:
        """An idle connection to ``backend`` now, or a Deferred of a new one."""
        idle = self._idle.get(backend.name)
        while idle:
            connection = idle.pop()
            if connection.connected:
                connection.reused = True
                return connection
        client = backend.client
        endpoint = self._tls.endpoint(
            self._reactor, client.host, client.port, client.tls, timeout=CONNECT_TIMEOUT_SECONDS
        )
        factory = protocol.Factory.forProtocol(lambda: BackendConnection(self, backend))
        factory.noisy = False
        d: defer.Deferred[Any] = endpoint.connect(factory)

        def made(connection: Any) -> BackendConnection:
            assert isinstance(connection, BackendConnection)
            self._all.add(connection)
            return connection

        return d.addCallback(made)

    def release(self, connection: BackendConnection) -> None:
        if not connection.connected:
            return
        idle = self._idle.setdefault(connection.backend.name, [])
        if len(idle) >= MAX_IDLE_PER_BACKEND:
            connection.close()
            return
        idle.append(connection)

    def forget(self, connection: BackendConnection) -> None:
        self._all.discard(connection)
        idle = self._idle.get(connection.backend.name)
        if idle and connection in idle:
            idle.remove(connection)

    def drop_idle(self, backend: Backend) -> None:
        for connection in self._idle.pop(backend.name, []):
            connection.abort()

    def close_all(self) -> None:
        self._idle.clear()
        for connection in list(self._all):
            connection.abort()
