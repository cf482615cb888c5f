"""Requests between processes that need an answer: declared once, typed at both ends.

An :class:`InternalCall` declares one internal endpoint: its name (the URL is
``/_synapse/replication/<name>``), its request and response types and which
process serves it. The types are frozen attrs classes whose fields declare
their kinds; they travel as JSON objects through the codec that also carries
stream rows (``synapse_lite/codec/``), which checks every field as strictly
as the client API does (a caller holding the secret is still not trusted
with bad data) and refuses a bad body with a 400 naming the field.
:class:`InternalCalls` is the one place that

* runs a call here when this process serves it (no HTTP, no JSON),
* otherwise POSTs it to the serving process with the shared secret, retrying a
  refused connection (the request never arrived) and, for idempotent calls,
  a connection that broke or timed out,
* maps a process that cannot be reached to a 503 the client may retry, and a
  refusal from the other side to the same error it raised there,
* waits, when the answer names a position of a stream the serving process
  writes, until replication has brought that position here, so the caller's
  next read on this process sees the write (read-your-writes),
* serves the calls this process has handlers for, checking the secret.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import attr
import treq
from treq.client import HTTPClient
from twisted.internet import defer
from twisted.internet import error as twisted_error
from twisted.web.client import Agent
from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.codec.kinds import DecodeContext
from synapse_lite.codec.objects import decode_object, encode_object
from synapse_lite.http.connection_pool import KeepAlivePool
from synapse_lite.http.server import JsonResource, parse_json_object_from_request
from synapse_lite.http.tls import InternalTlsClient
from synapse_lite.metrics import INTERNAL_CALL_SECONDS, INTERNAL_CALLS
from synapse_lite.streams.writers import ServedBy

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.config.homeserver import HomeServerConfig, InstanceLocation

logger = logging.getLogger(__name__)

PREFIX = "/_synapse/replication"
#: How long a caller waits for another process to answer. A client's request
#: is often what waits (a send forwarded to its room's writer), so this stays
#: well under clients' own timeouts: a frozen or overloaded writer becomes a
#: 503 the client retries (safely: writes are idempotent per transaction id)
#: rather than a hang.
REQUEST_TIMEOUT_SECONDS = 5.0
#: How long a forwarded write waits for replication to bring the writer's new
#: position here before answering anyway (the write is done; only this
#: process's view lags, e.g. while Redis restarts).
FORWARDED_WRITE_WAIT_SECONDS = 5.0
#: Attempts at reaching a process that refuses connections (it is restarting).
CONNECT_ATTEMPTS = 3


Req = TypeVar("Req")
Resp = TypeVar("Resp")


@attr.s(slots=True, frozen=True, auto_attribs=True)
class InternalCall(Generic[Req, Resp]):
    """One internal endpoint, declared once."""

    name: str
    #: The request and response types (attrs classes with field kinds).
    request: type[Req]
    response: type[Resp]
    #: Which process serves it (the main process, or a stream's writer: see
    #: ``config.writers``); None: the caller names it (a room's events writer,
    #: a user's device-lists writer).
    served_by: ServedBy | None = None
    #: Safe to send twice: retried after a broken connection or a timeout,
    #: not only after a refused connection.
    idempotent: bool = False
    #: ``(stream, position)`` the answer names: a caller on another process
    #: waits until it has seen the serving process reach it.
    answer_position: Callable[[Resp], tuple[str, int] | None] | None = None


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EmptyBody:
    """A request or answer with nothing in it."""


class InstanceLocations(Protocol):
    """Where processes answer internal HTTP (the instance directory)."""

    def locations_of(self, instance_name: str) -> list[InstanceLocation]: ...

    async def refresh(self) -> None: ...


class PositionWaiter(Protocol):
    async def wait_for_stream_position(
        self, instance_name: str, stream_name: str, position: int, timeout: float
    ) -> None: ...


class CallFailed(Exception):
    """Another process could not be reached, or did not answer as it should."""

    def __init__(self, instance_name: str, message: str) -> None:
        super().__init__(f"{instance_name}: {message}")
        self.instance_name = instance_name


Handler = Callable[[Any], Awaitable[Any]]


class InternalCalls:
    """Makes and serves this process's internal calls (see the module docstring)."""

    def __init__(
        self,
        *,
        config: HomeServerConfig,
        instance_name: str,
        clock: Clock,
        reactor: Any,
        locations: InstanceLocations,
        waiter: PositionWaiter,
    ) -> None:
        """``waiter``: waits for this process to see another's stream position."""
        self._config = config
        self._me = instance_name
        self._clock = clock
        self._locations = locations
        self._secret = config.worker_replication_secret
        self._decoding = DecodeContext(config.server_name)
        self._handlers: dict[str, tuple[InternalCall[Any, Any], Handler]] = {}
        self._waiter = waiter
        self._http = _InternalHttp(reactor, InternalTlsClient(config.internal_tls.ca_path))

    def serve(
        self, call: InternalCall[Req, Resp], handler: Callable[[Req], Awaitable[Resp]]
    ) -> None:
        """Handle ``call`` here: for callers on this process and on others."""
        if call.name in self._handlers:
            raise ValueError(f"the internal call {call.name!r} is already served")
        self._handlers[call.name] = (call, handler)

    def serves(self, call: InternalCall[Any, Any]) -> bool:
        return call.name in self._handlers

    # Calling

    def server_of(self, call: InternalCall[Any, Any]) -> str:
        if call.served_by is None:
            raise ValueError(f"the internal call {call.name!r} needs an instance to call")
        return self._config.writers.server_of(call.served_by)

    async def call(
        self, call: InternalCall[Req, Resp], request: Req, instance: str | None = None
    ) -> Resp:
        """Run ``call`` on the process that serves it (``instance``, or the one
        its declaration names) and return its answer; see the module docstring."""
        target = instance if instance is not None else self.server_of(call)
        if target == self._me:
            served = self._handlers.get(call.name)
            if served is None:
                raise SynapseError(500, f"{self._me} does not serve {call.name}", Codes.UNKNOWN)
            return await served[1](request)
        started = time.monotonic()
        try:
            body = await self._post(target, call, encode_object(request))
        except CallFailed as e:
            INTERNAL_CALLS.labels(call.name, target, "unreachable").inc()
            logger.warning("Internal call %s to %s failed: %s", call.name, target, e)
            raise SynapseError(
                503,
                f"The process handling this ({target}) is unavailable; try again",
                Codes.UNKNOWN,
            ) from None
        except SynapseError:
            INTERNAL_CALLS.labels(call.name, target, "refused").inc()
            raise
        finally:
            INTERNAL_CALL_SECONDS.labels(call.name).observe(time.monotonic() - started)
        INTERNAL_CALLS.labels(call.name, target, "ok").inc()
        try:
            answer = decode_object(call.response, body, self._decoding)
        except SynapseError as e:
            logger.warning("%s answered %s with a bad body: %s", target, call.name, e.msg)
            raise SynapseError(502, f"{target} gave a bad answer", Codes.UNKNOWN) from None
        if call.answer_position is not None:
            named = call.answer_position(answer)
            if named is not None:
                await self._wait_for(target, *named)
        return answer

    async def _wait_for(self, writer: str, stream_name: str, position: int) -> None:
        """After the replication timeout the write has still happened: log and
        go on rather than tell the client it failed."""
        try:
            await self._waiter.wait_for_stream_position(
                writer, stream_name, position, FORWARDED_WRITE_WAIT_SECONDS
            )
        except defer.TimeoutError:
            logger.warning(
                "Replication did not bring %s of %s to %d in time; answering anyway",
                stream_name,
                writer,
                position,
            )

    async def _post(
        self, target: str, call: InternalCall[Any, Any], body: dict[str, Any]
    ) -> dict[str, Any]:
        data = json.dumps(body).encode("utf-8")
        delay = 0.2
        attempts = CONNECT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            locations = await self._locations_of(target)
            # After a refused connection, the next address it may be at.
            location = locations[(attempt - 1) % len(locations)]
            url = f"{location.base_url}{PREFIX}/{call.name}"
            try:
                code, answer = await self._http.post(url, data, self._secret)
            except (twisted_error.ConnectionRefusedError, twisted_error.ConnectError) as e:
                if attempt == attempts:
                    raise CallFailed(target, f"cannot connect to {url}: {e}") from e
            except Exception as e:
                if not call.idempotent or attempt == attempts:
                    raise CallFailed(target, f"request to {url} failed: {e!r}") from e
            else:
                return _check_answer(target, url, code, answer)
            await self._clock.sleep(delay)
            delay *= 2
            # It may have restarted on another port: see what it recorded.
            await self._locations.refresh()
        raise AssertionError("unreachable")

    async def _locations_of(self, target: str) -> list[InstanceLocation]:
        try:
            return self._locations.locations_of(target)
        except KeyError:
            # Perhaps a process added since this one started: look again.
            await self._locations.refresh()
            try:
                return self._locations.locations_of(target)
            except KeyError as e:
                raise CallFailed(target, str(e.args[0])) from None

    def close(self) -> defer.Deferred[None]:
        return self._http.close()

    # Serving

    def resource(self) -> JsonResource:
        """The HTTP resource serving every call registered with :meth:`serve`."""
        resource = JsonResource("replication")
        for call, handler in self._handlers.values():
            resource.register_paths(
                "POST",
                f"{PREFIX}/{call.name}",
                self._servlet(call, handler),
                f"replication.{call.name}",
            )
        return resource

    def _servlet(self, call: InternalCall[Any, Any], handler: Handler) -> Any:
        async def servlet(request: Request) -> tuple[int, Any]:
            self._check_secret(request)
            body = parse_json_object_from_request(request, allow_empty=True)
            answer = await handler(decode_object(call.request, body, self._decoding))
            return 200, encode_object(answer)

        return servlet

    def _check_secret(self, request: Request) -> None:
        path = request.path.decode("ascii", "replace")
        if self._secret is None:
            # Without a secret nobody can prove they are one of our processes
            # (the config requires one whenever workers exist).
            logger.warning(
                "Refused a replication request from %s to %s: no worker_replication_secret"
                " is configured",
                request.getClientAddress(),
                path,
            )
            raise SynapseError(
                403, "Internal endpoints are off: no replication secret", Codes.FORBIDDEN
            )
        headers = request.requestHeaders.getRawHeaders(b"Authorization") or []
        expected = b"Bearer " + self._secret.encode("utf-8")
        if len(headers) != 1 or not hmac.compare_digest(headers[0], expected):
            logger.warning(
                "Refused a replication request from %s to %s: %s",
                request.getClientAddress(),
                path,
                "no credentials" if not headers else "bad credentials",
            )
            raise SynapseError(401, "Missing or invalid replication secret", Codes.UNAUTHORIZED)


def _check_answer(target: str, url: str, code: int, answer: Any) -> dict[str, Any]:
    if code != 200:
        if isinstance(answer, dict) and "errcode" in answer:
            # The other side refused: the same error, as if it happened here.
            extra = {k: v for k, v in answer.items() if k not in ("errcode", "error")}
            raise SynapseError(code, str(answer.get("error", "")), str(answer["errcode"]), extra)
        raise CallFailed(target, f"{url} answered {code}")
    if not isinstance(answer, dict):
        raise CallFailed(target, f"{url} answered a non-object")
    return answer


class _InternalHttp:
    """POSTs JSON with the shared secret over a pool of persistent connections."""

    def __init__(self, reactor: Any, tls: InternalTlsClient) -> None:
        self._pool = KeepAlivePool(reactor)
        self._pool.maxPersistentPerHost = 20
        self._pool.retryAutomatically = False
        agent = Agent.usingEndpointFactory(
            reactor, _NoDelayEndpointFactory(reactor, tls), pool=self._pool
        )
        self._treq = HTTPClient(agent)

    async def post(self, url: str, data: bytes, secret: str | None) -> tuple[int, Any]:
        """``(status, parsed JSON)``; a body that is not JSON is a :class:`CallFailed`."""
        headers: dict[bytes | str, list[bytes | str]] = {"Content-Type": ["application/json"]}
        if secret:
            headers["Authorization"] = [f"Bearer {secret}"]
        response = await self._treq.post(
            url, data=data, headers=headers, timeout=REQUEST_TIMEOUT_SECONDS
        )
        content = await treq.content(response)
        try:
            return response.code, json.loads(content)
        except ValueError:
            raise CallFailed(url, f"answered {response.code} with non-JSON") from None

    def close(self) -> defer.Deferred[None]:
        return self._pool.close()


class _NoDelayEndpointFactory:
    """Endpoints whose connections send small writes at once.

    Without TCP_NODELAY a request written as headers then body waits for the
    peer's delayed ACK of the headers (tens of milliseconds) before the body
    goes: every forwarded client request would pay it.
    """

    def __init__(self, reactor: Any, tls: InternalTlsClient) -> None:
        self._reactor = reactor
        self._tls = tls

    def endpointForURI(self, uri: Any) -> Any:
        host = uri.host.decode("ascii")
        tls = uri.scheme == b"https"
        return _NoDelayEndpoint(self._tls.endpoint(self._reactor, host, uri.port, tls))


class _NoDelayEndpoint:
    def __init__(self, endpoint: Any) -> None:
        self._endpoint = endpoint

    def connect(self, factory: Any) -> Any:
        def no_delay(protocol: Any) -> Any:
            set_tcp_nodelay(protocol.transport)
            return protocol

        return self._endpoint.connect(factory).addCallback(no_delay)


def set_tcp_nodelay(transport: Any) -> None:
    """Turn Nagle's algorithm off on a TCP transport (no-op for others)."""
    setter = getattr(transport, "setTcpNoDelay", None)
    if setter is not None:
        try:
            setter(True)
        except OSError:
            pass
