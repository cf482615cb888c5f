"""One request through the router, from its head to the end of its response.

An :class:`Exchange` routes its request (``router.py``), takes a kept-alive
connection to the chosen process (``pool.py``), sends the head with
``X-Forwarded-For`` and the router's proof added (``http/forwarded.py``) and
the body as it arrives, and passes the response back to the client as it
comes. When the process cannot be reached (refused, or lost before it
answered), the request goes again, to another process of the same role if the
route has one: always when it never reached the process, and for a request
safe to repeat (GET, HEAD, PUT, DELETE, OPTIONS: Matrix writes by PUT carry a
transaction id) when it may have. A body is kept for that up to
:data:`REPLAY_LIMIT`; a bigger one is streamed and not repeated.
"""

from __future__ import annotations

import json
import logging
import time
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.internet.interfaces import IDelayedCall
from twisted.python.failure import Failure

from synapse_lite.http.forwarded import FORWARDED_FOR, ROUTER_PROOF
from synapse_lite.metrics import (
    ROUTER_OPEN_REQUESTS,
    ROUTER_REQUESTS,
    ROUTER_RESPONSE_SECONDS,
    ROUTER_RETRIES,
)
from synapse_lite.routing.backends import Backend
from synapse_lite.routing.http1 import (
    BadMessage,
    Framing,
    RequestHead,
    ResponseHead,
    UntilClose,
    serialize_head,
    without_hop_by_hop,
)
from synapse_lite.routing.pool import BackendConnection
from synapse_lite.sockets import write_now

if TYPE_CHECKING:
    from synapse_lite.routing.relay import ClientConnection, Relay
    from synapse_lite.routing.router import Decision

logger = logging.getLogger(__name__)

#: A request body up to this size is kept, so the request can be sent again.
REPLAY_LIMIT = 256 * 1024
#: Bytes of a body held while no process has taken the request yet, before
#: the client's socket is paused.
MAX_PENDING_BYTES = 256 * 1024
#: Attempts at one request (the first and the repeats).
MAX_ATTEMPTS = 3
#: Methods a request may be repeated with even if the process may have seen it.
IDEMPOTENT_METHODS = frozenset({b"GET", b"HEAD", b"PUT", b"DELETE", b"OPTIONS"})
#: Headers of the client's the router replaces with its own.
_REPLACED = frozenset(
    {FORWARDED_FOR.lower(), ROUTER_PROOF.lower(), b"x-forwarded-proto", b"x-real-ip", b"forwarded"}
)
REASONS = {
    200: b"OK",
    400: b"Bad Request",
    404: b"Not Found",
    413: b"Payload Too Large",
    431: b"Request Header Fields Too Large",
    501: b"Not Implemented",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
    505: b"HTTP Version Not Supported",
}


_answered: dict[tuple[str, int], Any] = {}
_waited: dict[str, Any] = {}


def _count_answer(route: str, status: int) -> None:
    """``ROUTER_REQUESTS`` for one answer (children kept: a lookup per request
    would cost more than the rest of the bookkeeping)."""
    child = _answered.get((route, status))
    if child is None:
        child = _answered[(route, status)] = ROUTER_REQUESTS.labels(route, str(status))
    child.inc()


def _time_to_head(route: str, seconds: float) -> None:
    child = _waited.get(route)
    if child is None:
        child = _waited[route] = ROUTER_RESPONSE_SECONDS.labels(route)
    child.observe(seconds)


def error_body(status: int, message: str) -> bytes:
    code = "M_UNRECOGNIZED" if status == 404 else "M_UNKNOWN"
    return json.dumps({"errcode": code, "error": message}).encode("utf-8")


class LocalAnswer:
    """A response the router gives itself (its /health, a refusal)."""

    def __init__(
        self,
        status: int,
        body: bytes,
        content_type: bytes = b"application/json",
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type
        self.headers = headers or []

    @classmethod
    def error(cls, status: int, message: str, retry_after: int | None = None) -> LocalAnswer:
        headers = [(b"Retry-After", str(retry_after).encode())] if retry_after else []
        return cls(status, error_body(status, message), headers=headers)


class Exchange:
    """One request through the router, from its head to the end of its response."""

    def __init__(
        self, relay: Relay, client: ClientConnection, head: RequestHead, body_complete: bool
    ) -> None:
        self.relay = relay
        self.client = client
        self.head = head
        self.keep_alive = head.keep_alive
        self.started = time.monotonic()
        self.route_name = "router"
        self.backend: Backend | None = None
        self.attempts = 0
        self.status = 0
        self.body_complete = body_complete
        #: Body chunks not yet written to a process.
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        #: The whole body so far, while it is small enough to send again.
        self._replay: list[bytes] | None = []
        self._replay_bytes = 0
        self._connection: BackendConnection | None = None
        self._connecting: defer.Deferred[Any] | None = None
        self.response_started = False
        self.finished = False
        self._stale_retried = False
        self._timeout: IDelayedCall | None = None
        #: Bytes for the client held while a read from the process is parsed,
        #: and for the process while the client's read is, each sent as one
        #: write (one segment: both sockets have Nagle off). None: not held.
        self._client_out: list[bytes] | None = None
        self._process_out: list[bytes] | None = None
        ROUTER_OPEN_REQUESTS.inc()

    # Routing and connecting

    def start(self) -> None:
        self._timeout = self.relay.reactor.callLater(self.relay.request_timeout, self._timed_out)
        self._route()

    def _route(self) -> None:
        decision = self.relay.router.decide(self.head, self.client.client_ip)
        if isinstance(decision, defer.Deferred):
            decision.addCallbacks(self._decided, self._route_failed)
        else:
            self._decided(decision)

    def _route_failed(self, failure: Failure) -> None:
        logger.error("Routing %s failed: %s", self.head.path, failure.getTraceback())
        self.answer(LocalAnswer.error(502, "The router could not route this request"))

    def _decided(self, decision: Decision) -> None:
        if self.finished:
            return
        self.route_name = decision.route_name
        if decision.refusal is not None:
            self.answer(decision.refusal)
            return
        backend = decision.backend
        assert backend is not None
        self.backend = backend
        self.attempts += 1
        got = self.relay.pool.acquire(backend)
        if isinstance(got, BackendConnection):
            self._connected(got)
            return
        self._connecting = got
        got.addCallbacks(self._connected, self._connect_failed)

    def _connect_failed(self, failure: Failure) -> None:
        self._connecting = None
        if self.finished:
            return
        backend = self.backend
        assert backend is not None
        self.relay.router.report_unreachable(backend, failure.getErrorMessage())
        # It never saw the request: any request may go again.
        self._again("connect", repeatable=True)

    def _connected(self, connection: BackendConnection) -> None:
        self._connecting = None
        if self.finished:
            self.relay.pool.release(connection)
            return
        self._connection = connection
        assert self.backend is not None
        self.relay.waiting.setdefault(self.backend.name, set()).add(self)
        connection.attach(self)
        pending, self._pending, self._pending_bytes = self._pending, [], 0
        self._to_process(b"".join([self._forwarded_head(), *pending]))
        if not self.body_complete:
            # The process's socket paces the client's while the body streams.
            connection.stream_from(self.client)
            self.client.resume()

    def _forwarded_head(self) -> bytes:
        head = self.head
        headers = without_hop_by_hop(head.headers, _REPLACED)
        headers += [
            (FORWARDED_FOR, self.client.client_ip.encode("ascii", "replace")),
            (b"X-Forwarded-Proto", self.client.scheme),
            (ROUTER_PROOF, self.relay.proof),
        ]
        return serialize_head(b" ".join((head.method, head.target, head.version)), headers)

    # Writes held to be sent together

    def hold_request(self) -> None:
        """Hold what goes to the process until :meth:`release_request`."""
        if self._process_out is None:
            self._process_out = []

    def release_request(self) -> None:
        out, self._process_out = self._process_out, None
        if out and self._connection is not None:
            self._connection.write(b"".join(out))

    def _to_process(self, data: bytes) -> None:
        assert self._connection is not None
        if self._process_out is not None:
            self._process_out.append(data)
        else:
            self._connection.write(data)

    def hold_output(self) -> None:
        """Hold what goes to the client until :meth:`release_output`."""
        if self._client_out is None:
            self._client_out = []

    def release_output(self) -> None:
        out, self._client_out = self._client_out, None
        transport = self.client.transport
        if out and transport is not None and not self.client.closing:
            write_now(transport, b"".join(out))

    def _to_client(self, data: bytes) -> None:
        if self._client_out is not None:
            self._client_out.append(data)
        elif self.client.transport is not None:
            write_now(self.client.transport, data)

    # The request's body

    def body_data(self, chunk: bytes) -> None:
        if self._replay is not None:
            self._replay.append(chunk)
            self._replay_bytes += len(chunk)
            if self._replay_bytes > REPLAY_LIMIT:
                self._replay = None
        if self._connection is not None:
            self._to_process(chunk)
        elif not self.finished:
            self._pending.append(chunk)
            self._pending_bytes += len(chunk)
            if self._pending_bytes > MAX_PENDING_BYTES:
                self.client.pause()  # until a process takes it

    def body_done(self) -> None:
        self.body_complete = True
        if self._connection is not None:
            self._connection.stop_streaming()

    def bad_request_body(self, error: BadMessage) -> None:
        """The client's body is malformed (a broken chunked encoding)."""
        if self.response_started:
            self._abort_all()
            return
        self._drop_connection(abort=True)
        self.keep_alive = False
        self.answer(LocalAnswer.error(error.status, error.reason))

    # Failures and repeats

    def _again(self, reason: str, repeatable: bool) -> None:
        """The process did not answer: send the request again, or give up."""
        assert self.backend is not None
        replayable = self._replay is not None
        if repeatable and replayable and self.attempts < MAX_ATTEMPTS:
            ROUTER_RETRIES.labels(reason).inc()
            self._pending = list(self._replay or [])
            self._pending_bytes = self._replay_bytes
            self._route()
            return
        logger.warning(
            "%s %s: %s did not answer (%s); giving up",
            self.head.method.decode(),
            self.head.path,
            self.backend.name,
            reason,
        )
        self.answer(
            LocalAnswer.error(
                502, f"The process serving this request ({self.backend.name}) failed; try again"
            )
        )

    def backend_lost(self, reason: str, stale: bool = False) -> None:
        """The connection to the process ended before its response did
        (``stale``: a kept connection, lost before any answer)."""
        self._forget_connection()
        if self.backend is not None:
            # Its other kept connections are likely as dead (it restarted, or
            # was killed): the next attempt connects afresh, and learns.
            self.relay.pool.drop_idle(self.backend)
        if self.finished:
            return
        if self.response_started:
            self._abort_all()  # part of a response is out: nothing else to do
            return
        if stale and not self._stale_retried:
            # Not an attempt at the process as it is now: once more, afresh.
            self._stale_retried = True
            self.attempts -= 1
        self._again(reason, repeatable=self.head.method in IDEMPOTENT_METHODS)

    def backend_unresponsive(self) -> None:
        """The health checks found the process down while this waits on it."""
        if self.finished or self.response_started or self._connection is None:
            return
        self._connection.abort()  # backend_lost follows, from connectionLost

    def _timed_out(self) -> None:
        self._timeout = None
        if self.finished or self.response_started:
            return
        self._drop_connection(abort=True)
        self.keep_alive = False
        self.answer(LocalAnswer.error(504, "The process serving this request did not answer"))

    def client_gone(self) -> None:
        """The client closed its connection: stop the work it asked for."""
        if self.finished:
            return
        self._drop_connection(abort=True)
        self._finish(499)

    def _abort_all(self) -> None:
        self._client_out = None  # a part of a response: not worth sending
        self._drop_connection(abort=True)
        if self.client.transport is not None:
            self.client.closing = True
            self.client.transport.abortConnection()
        self._finish(502)

    # The response

    def interim(self, head: ResponseHead) -> None:
        """A 1xx (100 Continue): passed on to HTTP/1.1 clients."""
        if self.head.version == b"HTTP/1.1":
            first = b"HTTP/1.1 %d %s" % (head.status, head.reason)
            self._to_client(serialize_head(first, without_hop_by_hop(head.headers)))

    def response_head(self, head: ResponseHead, framing: Framing) -> None:
        self.response_started = True
        _time_to_head(self.route_name, time.monotonic() - self.started)
        self.status = head.status
        headers = without_hop_by_hop(head.headers)
        # A response that ends with its connection, or one that came before the
        # whole request did: the client's connection cannot carry another.
        if isinstance(framing, UntilClose) or not self.body_complete:
            self.keep_alive = False
        if not self.keep_alive:
            headers.append((b"Connection", b"close"))
        assert self.client.transport is not None
        self._to_client(
            serialize_head(b"%s %d %s" % (self.head.version, head.status, head.reason), headers)
        )
        if self._connection is not None:
            self._connection.stream_to(self.client)

    def response_data(self, chunk: bytes) -> None:
        self._to_client(chunk)

    def response_done(self, connection_reusable: bool) -> None:
        self.release_output()  # before the client's connection goes on (or closes)
        connection = self._connection
        self._forget_connection()
        if connection is not None:
            if connection_reusable and self.body_complete:
                self.relay.pool.release(connection)
            else:
                connection.close()
        self._finish(self.status)
        self.client.exchange_done(self.keep_alive)

    def answer(self, local: LocalAnswer) -> None:
        """Answer from the router itself."""
        if self.finished:
            return
        self._drop_connection(abort=True)
        self.response_started = True
        if not self.body_complete:
            self.keep_alive = False  # the rest of the body is not read
        headers = [
            (b"Content-Type", local.content_type),
            (b"Content-Length", str(len(local.body)).encode()),
            (b"Cache-Control", b"no-cache, no-store, must-revalidate"),
            *local.headers,
        ]
        if not self.keep_alive:
            headers.append((b"Connection", b"close"))
        reason = REASONS.get(local.status, b"Error")
        transport = self.client.transport
        if transport is not None:
            first = b"%s %d %s" % (self.head.version, local.status, reason)
            write_now(transport, serialize_head(first, headers) + local.body)
        self._finish(local.status)
        self.client.exchange_done(self.keep_alive)

    # Bookkeeping

    def _drop_connection(self, abort: bool) -> None:
        connection = self._connection
        self._forget_connection()
        if self._connecting is not None:
            connecting, self._connecting = self._connecting, None
            connecting.cancel()
        if connection is not None:
            connection.abort() if abort else connection.close()

    def _forget_connection(self) -> None:
        if self._process_out is not None:
            self._process_out = []  # for that connection; a repeat sends its own
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.detach()
        if self.backend is not None:
            waiting = self.relay.waiting.get(self.backend.name)
            if waiting is not None:
                waiting.discard(self)

    def _finish(self, status: int) -> None:
        if self.finished:
            return
        self.finished = True
        if self._timeout is not None and self._timeout.active():
            self._timeout.cancel()
        self._timeout = None
        ROUTER_OPEN_REQUESTS.dec()
        _count_answer(self.route_name, status)
