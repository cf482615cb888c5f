"""The router's HTTP/1.1 relay: client connections in, pooled connections out.

A :class:`ClientConnection` reads one client's requests, one after another
(pipelined ones wait their turn), parses each head (``http1.py``) and hands it
to an :class:`~.exchange.Exchange`, which routes it and relays it over a
kept-alive connection (``pool.py``): the body chunk by chunk as it arrives,
the response flowing back as the process writes it (a /sync long-poll stays
open as long as the process keeps it). Both directions apply backpressure: a
slow reader pauses the other side's socket. When a process goes down while
requests wait on it (a frozen process, seen by the health checks), the
:class:`Relay` has those requests repeated elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet import protocol
from twisted.internet.interfaces import IDelayedCall
from twisted.python.failure import Failure

from synapse_lite.http.tls import InternalTlsClient
from synapse_lite.replication.http.calls import set_tcp_nodelay
from synapse_lite.routing.backends import Backend
from synapse_lite.routing.exchange import REASONS, Exchange, LocalAnswer, error_body
from synapse_lite.routing.http1 import (
    MAX_HEAD_BYTES,
    BadMessage,
    Framing,
    RequestHead,
    parse_request_head,
    request_framing,
    serialize_head,
)
from synapse_lite.routing.pool import BackendPool

if TYPE_CHECKING:
    from synapse_lite.routing.router import Router

#: Bytes read ahead of the request under way (pipelined ones) before the
#: client's socket is paused.
MAX_BUFFERED_BYTES = 256 * 1024
#: A client connection with no request under way is closed after this long.
IDLE_TIMEOUT_SECONDS = 180.0
#: A request head must arrive within this long once it has begun.
HEAD_TIMEOUT_SECONDS = 30.0


class Relay:
    """What the client connections share: the router, the pool of connections
    to processes, the proof, and the requests under way on each process."""

    def __init__(
        self,
        reactor: Any,
        router: Router,
        tls: InternalTlsClient,
        proof: str,
        request_timeout: float,
        local_pages: Callable[[RequestHead, tuple[str, ...]], LocalAnswer | None],
    ) -> None:
        self.reactor = reactor
        self.router = router
        self.pool = BackendPool(reactor, tls)
        self.proof = proof.encode("ascii")
        self.request_timeout = request_timeout
        self.local_pages = local_pages
        #: Requests waiting for a process's answer, by process name.
        self.waiting: dict[str, set[Exchange]] = {}
        self.clients: set[ClientConnection] = set()

    def backend_down(self, backend: Backend) -> None:
        """A process is down: requests still waiting on it go elsewhere."""
        for exchange in list(self.waiting.get(backend.name, ())):
            exchange.backend_unresponsive()
        self.pool.drop_idle(backend)

    def close_clients(self) -> None:
        """Cut every client connection (the router is stopping)."""
        for client in list(self.clients):
            client.closing = True
            if client.transport is not None:
                client.transport.abortConnection()

    def factory(self, resources: tuple[str, ...], tls: bool) -> protocol.Factory:
        relay = self

        class ClientFactory(protocol.Factory):
            noisy = False

            def buildProtocol(self, addr: Any) -> ClientConnection:
                return ClientConnection(relay, resources, b"https" if tls else b"http")

        return ClientFactory()


class ClientConnection(protocol.Protocol):
    """One client's connection: requests one after another (pipelined ones
    wait their turn), each an :class:`Exchange`."""

    #: A TCP (or TLS) transport: a producer and a consumer.
    transport: Any

    def __init__(self, relay: Relay, resources: tuple[str, ...], scheme: bytes) -> None:
        self.relay = relay
        self.resources = resources
        self.scheme = scheme
        self.client_ip = "unknown"
        self._buffer = bytearray()
        self.exchange: Exchange | None = None
        self._body: Framing | None = None
        self.paused = False
        self.closing = False
        self._timer: IDelayedCall | None = None

    # Connection

    def connectionMade(self) -> None:
        assert self.transport is not None
        set_tcp_nodelay(self.transport)
        self.client_ip = str(getattr(self.transport.getPeer(), "host", "unknown"))
        self.relay.clients.add(self)
        self._arm_timer(IDLE_TIMEOUT_SECONDS)

    def connectionLost(self, reason: Failure | None = None) -> None:
        self.closing = True
        self._cancel_timer()
        self.relay.clients.discard(self)
        if self.exchange is not None:
            self.exchange.client_gone()

    def _arm_timer(self, seconds: float) -> None:
        self._cancel_timer()
        self._timer = self.relay.reactor.callLater(seconds, self._timed_out)

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _timed_out(self) -> None:
        self._timer = None
        if self.exchange is None and self.transport is not None:
            self.closing = True
            self.transport.loseConnection()

    def pause(self) -> None:
        if not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pauseProducing()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closing:
            self.paused = False
            self.transport.resumeProducing()

    # Reading

    def dataReceived(self, data: bytes) -> None:
        if self.closing:
            return
        self._buffer += data
        if self.exchange is None:
            self._read_heads()
        elif self._body is not None:
            self._read_body()
        elif len(self._buffer) > MAX_BUFFERED_BYTES:
            self.pause()  # pipelined requests wait for this one

    def _read_heads(self) -> None:
        while self.exchange is None and self._buffer and not self.closing:
            while self._buffer[:2] == b"\r\n":
                del self._buffer[:2]  # blank lines before a request are allowed
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    self.refuse(431, "The request's head is too large")
                elif self._buffer:
                    self._arm_timer(HEAD_TIMEOUT_SECONDS)
                return
            block = bytes(self._buffer[:end])
            del self._buffer[: end + 4]
            try:
                head = parse_request_head(block)
                framing = request_framing(head)
            except BadMessage as e:
                self.refuse(e.status, e.reason)
                return
            self._cancel_timer()
            self._begin(head, framing)

    def _begin(self, head: RequestHead, framing: Framing) -> None:
        exchange = Exchange(self.relay, self, head, framing.complete)
        self.exchange = exchange
        if not framing.complete:
            self._body = framing
        # The head and what came of the body with it go to the process in one write.
        exchange.hold_request()
        try:
            local = self.relay.local_pages(head, self.resources)
            if local is not None:
                exchange.answer(local)
            else:
                exchange.start()
            if self._body is not None and self.exchange is exchange:
                self._read_body()
        finally:
            exchange.release_request()

    def _read_body(self) -> None:
        framing, exchange = self._body, self.exchange
        assert framing is not None and exchange is not None
        try:
            taken = framing.feed(self._buffer)
        except BadMessage as e:
            self._body = None
            exchange.bad_request_body(e)
            return
        if taken:
            chunk = bytes(self._buffer[:taken])
            del self._buffer[:taken]
            exchange.body_data(chunk)
        if framing.complete:
            self._body = None
            exchange.body_done()

    # Answering

    def exchange_done(self, keep_alive: bool) -> None:
        """The response is written: next request, or close."""
        self.exchange = None
        if self.closing:
            return
        if not keep_alive or self._body is not None:
            self.closing = True
            assert self.transport is not None
            self.transport.loseConnection()
            return
        self.resume()
        self._arm_timer(IDLE_TIMEOUT_SECONDS)
        if self._buffer:
            self._read_heads()

    def refuse(self, status: int, reason: str) -> None:
        """Answer a request that cannot be read, then close."""
        body = error_body(status, reason)
        head = serialize_head(
            b"HTTP/1.1 %d %s" % (status, REASONS.get(status, b"Error")),
            [
                (b"Content-Type", b"application/json"),
                (b"Content-Length", str(len(body)).encode()),
                (b"Connection", b"close"),
            ],
        )
        self.closing = True
        assert self.transport is not None
        self.transport.write(head + body)
        self.transport.loseConnection()
