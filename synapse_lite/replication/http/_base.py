"""The internal HTTP endpoint base, its server resource and its client."""

from __future__ import annotations

import abc
import hmac
import json
import logging
from typing import TYPE_CHECKING, Any, ClassVar

import treq
from twisted.internet import error as twisted_error
from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.http.server import JsonResource, parse_json_object_from_request

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

logger = logging.getLogger(__name__)

PREFIX = "/_synapse/replication"
#: How long a caller waits for another process to answer. A client's request
#: is often what waits (a send forwarded to its room's writer), so this stays
#: well under clients' own timeouts: a frozen or overloaded writer becomes a
#: 503 the client retries (safely: sends are idempotent per transaction id)
#: rather than a hang.
REQUEST_TIMEOUT_SECONDS = 5.0


class ReplicationEndpoint(abc.ABC):
    """One kind of request another process can send to this one.

    ``NAME`` is the URL path segment; the body and the answer are JSON objects.
    Errors raised as :class:`SynapseError` reach the caller with their code and
    errcode (so a forwarded client request fails the way a local one would).
    """

    NAME: ClassVar[str]

    def __init__(self, hs: HomeServer) -> None:
        self.hs = hs

    @abc.abstractmethod
    async def handle(self, body: dict[str, Any]) -> dict[str, Any]:
        """Do the work and return the answer."""


class ReplicationRestResource(JsonResource):
    """Serves the internal endpoints; every request must carry the shared
    secret as ``Authorization: Bearer <secret>``."""

    def __init__(self, hs: HomeServer, endpoints: list[ReplicationEndpoint]) -> None:
        super().__init__("replication")
        self._secret = hs.config.worker_replication_secret
        for endpoint in endpoints:
            self.register_paths(
                "POST",
                f"{PREFIX}/{endpoint.NAME}",
                self._make_callback(endpoint),
                f"replication.{endpoint.NAME}",
            )

    def _make_callback(self, endpoint: ReplicationEndpoint) -> Any:
        async def callback(request: Request) -> tuple[int, Any]:
            self._check_auth(request)
            body = parse_json_object_from_request(request, allow_empty=True)
            return 200, await endpoint.handle(body)

        return callback

    def _check_auth(self, request: Request) -> None:
        if self._secret is None:
            # Without a secret nobody can prove they are one of our processes
            # (the config requires one whenever workers exist).
            logger.warning(
                "Refused a replication request from %s to %s: no"
                " worker_replication_secret is configured",
                request.getClientAddress(),
                request.path.decode("ascii", "replace"),
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
                request.path.decode("ascii", "replace"),
                "no credentials" if not headers else "bad credentials",
            )
            raise SynapseError(401, "Missing or invalid replication secret", Codes.UNAUTHORIZED)


class ReplicationClientError(Exception):
    """Another process could not be reached or answered with an error."""

    def __init__(self, instance_name: str, message: str, code: int | None = None, body: Any = None):
        super().__init__(f"{instance_name}: {message}")
        self.instance_name = instance_name
        self.code = code
        self.body = body


class _NoDelayEndpointFactory:
    """Endpoints whose connections send small writes at once.

    Without TCP_NODELAY a request written as headers then body waits for the
    peer's delayed ACK of the headers (tens of milliseconds) before the body
    goes: every forwarded client request would pay it.
    """

    def __init__(self, reactor: Any) -> None:
        self._reactor = reactor

    def endpointForURI(self, uri: Any) -> Any:
        from twisted.internet.endpoints import HostnameEndpoint

        endpoint = HostnameEndpoint(self._reactor, uri.host, uri.port)
        return _NoDelayEndpoint(endpoint)


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


class ReplicationClient:
    """Calls internal endpoints of other processes (treq, shared secret)."""

    def __init__(self, hs: HomeServer) -> None:
        from treq.client import HTTPClient
        from twisted.web.client import Agent, HTTPConnectionPool

        self._hs = hs
        self._pool = HTTPConnectionPool(hs.reactor, persistent=True)
        self._pool.maxPersistentPerHost = 20
        self._pool.retryAutomatically = False
        agent = Agent.usingEndpointFactory(
            hs.reactor, _NoDelayEndpointFactory(hs.reactor), pool=self._pool
        )
        self._treq = HTTPClient(agent)
        self._secret = hs.config.worker_replication_secret

    async def call(
        self,
        instance_name: str,
        endpoint: str,
        body: dict[str, Any],
        timeout: float | None = None,
        attempts: int = 3,
    ) -> dict[str, Any]:
        """POST ``body`` to ``endpoint`` on ``instance_name`` and return its answer.

        A refused connection (the process is restarting) is retried, since the
        request never reached it. A :class:`SynapseError` from the other side is
        raised again here as the same error.
        """
        if timeout is None:
            timeout = REQUEST_TIMEOUT_SECONDS
        headers: dict[bytes | str, list[bytes | str]] = {"Content-Type": ["application/json"]}
        if self._secret:
            headers["Authorization"] = [f"Bearer {self._secret}"]
        data = json.dumps(body).encode("utf-8")
        directory = self._hs.instance_directory
        delay = 0.2
        for attempt in range(1, attempts + 1):
            try:
                locations = directory.locations_of(instance_name)
            except KeyError as e:
                # Perhaps a process added since this one started: look again.
                await directory.refresh()
                try:
                    locations = directory.locations_of(instance_name)
                except KeyError:
                    raise ReplicationClientError(instance_name, str(e.args[0])) from None
            # After a refused connection, the next address it may be at.
            location = locations[(attempt - 1) % len(locations)]
            url = f"{location.base_url}{PREFIX}/{endpoint}"
            try:
                response = await self._treq.post(url, data=data, headers=headers, timeout=timeout)
                content = await treq.content(response)
                break
            except (twisted_error.ConnectionRefusedError, twisted_error.ConnectError) as e:
                if attempt == attempts:
                    raise ReplicationClientError(
                        instance_name, f"cannot connect to {url}: {e}"
                    ) from e
                await self._hs.clock.sleep(delay)
                delay *= 2
                # It may have restarted on another port: see what it recorded.
                await directory.refresh()
            except Exception as e:
                raise ReplicationClientError(
                    instance_name, f"request to {url} failed: {e!r}"
                ) from e
        try:
            answer = json.loads(content)
        except ValueError:
            raise ReplicationClientError(
                instance_name, f"{url} answered {response.code} with non-JSON", response.code
            ) from None
        if response.code != 200:
            if isinstance(answer, dict) and "errcode" in answer:
                extra = {k: v for k, v in answer.items() if k not in ("errcode", "error")}
                raise SynapseError(
                    response.code, str(answer.get("error", "")), str(answer["errcode"]), extra
                )
            raise ReplicationClientError(
                instance_name, f"{url} answered {response.code}", response.code, answer
            )
        if not isinstance(answer, dict):
            raise ReplicationClientError(instance_name, f"{url} answered a non-object")
        return answer

    def close(self) -> Any:
        return self._pool.closeCachedConnections()
