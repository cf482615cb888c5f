"""HTTP requests to other homeservers (treq), signed with ``X-Matrix``.

Where a server is reached is found by ``discovery.py`` (an explicit
``federation.destinations`` entry, else ``.well-known``, SRV, port 8448) and
connected to by ``connect.py`` (address checks, TLS with SNI). Certificates
must chain to the system's CAs or to ``federation.extra_ca_paths`` and name
the host the spec says, unless ``federation.verify_certificates`` is false
(tests only; logged as a warning).
"""

from __future__ import annotations

import json
import logging
from typing import IO, TYPE_CHECKING, Any

import treq
from treq.client import HTTPClient
from twisted.internet import defer
from twisted.internet.protocol import Protocol
from twisted.web.client import Agent
from twisted.web.iweb import IPolicyForHTTPS

from synapse_lite.federation.auth import sign_request
from synapse_lite.federation.connect import (
    SCHEME,
    AddressResolver,
    FederationEndpoints,
    HttpsWellKnownFetcher,
    NoVerificationPolicy,
    TwistedSrvResolver,
    system_address_resolver,
)
from synapse_lite.federation.discovery import ServerDiscovery, ServerNameError
from synapse_lite.http.connection_pool import KeepAlivePool
from synapse_lite.http.outbound import OutboundHttpClient
from synapse_lite.http.tls import https_policy_trusting

if TYPE_CHECKING:
    from synapse_lite.config.federation import FederationConfig
    from synapse_lite.federation.crypto import SigningKey

logger = logging.getLogger(__name__)

#: Largest answer we read from another server.
MAX_RESPONSE_BYTES = 4 * 1024 * 1024
#: Longest error answer read from a download.
MAX_ERROR_BYTES = 64 * 1024
#: Longest a download's body may take to arrive.
DOWNLOAD_TIMEOUT_SECONDS = 300.0


class FederationRequestError(Exception):
    """A request to another server failed: not reached, timed out, or
    answered with an error (``code`` and ``body`` then say which)."""

    def __init__(
        self, destination: str, message: str, code: int | None = None, body: Any = None
    ) -> None:
        super().__init__(f"{destination}: {message}")
        self.destination = destination
        self.code = code
        self.body = body


class FederationClient:
    """Signed requests to other servers, one connection pool per process."""

    def __init__(
        self,
        config: FederationConfig,
        reactor: Any,
        signing_key: SigningKey,
        server_name: str,
        *,
        discovery: ServerDiscovery | None = None,
        resolve_addresses: AddressResolver | None = None,
    ) -> None:
        self._config = config
        self._signing_key = signing_key
        self._reactor = reactor
        self._server_name = server_name
        self._pool = KeepAlivePool(reactor)
        self._pool.maxPersistentPerHost = 5
        # A request that failed on a reused connection must not be resent
        # behind our back: the sender decides about retries.
        self._pool.retryAutomatically = False
        policy = federation_tls_policy(config)
        self._srv: TwistedSrvResolver | None = None
        if discovery is None:
            well_known = OutboundHttpClient(
                reactor, config.address_filter, policy, section="federation"
            )
            self._srv = TwistedSrvResolver(reactor)
            discovery = ServerDiscovery(
                clock_time=reactor.seconds,
                srv=self._srv,
                well_known=HttpsWellKnownFetcher(well_known, config.request_timeout_seconds),
                overrides=config.destinations,
            )
        self.discovery = discovery
        endpoints = FederationEndpoints(
            reactor=reactor,
            discovery=discovery,
            address_filter=config.address_filter,
            tls_policy=policy,
            resolve_addresses=resolve_addresses or system_address_resolver(reactor),
            connect_timeout=config.request_timeout_seconds,
        )
        self._http = HTTPClient(Agent.usingEndpointFactory(reactor, endpoints, pool=self._pool))

    def close(self) -> defer.Deferred[None]:
        if self._srv is not None:
            self._srv.close()
        return self._pool.close()

    async def get_json(self, destination: str, path: str, signed: bool = True) -> Any:
        """GET ``path`` on ``destination``; its JSON answer (200 only)."""
        return await self._request("GET", destination, path, None, signed)

    async def post_json(
        self, destination: str, path: str, content: dict[str, Any], signed: bool = True
    ) -> Any:
        """POST JSON to ``path`` on ``destination``; its JSON answer (200 only)."""
        return await self._request("POST", destination, path, content, signed)

    async def put_json(self, destination: str, path: str, content: dict[str, Any]) -> Any:
        """PUT signed JSON to ``path`` on ``destination``; its JSON answer (200 only)."""
        return await self._request("PUT", destination, path, content, True)

    async def _send(
        self, method: str, destination: str, path: str, content: Any, signed: bool
    ) -> Any:
        """Send one request; its treq response (body not read yet)."""
        try:
            route = await self.discovery.resolve(destination)
        except ServerNameError as e:
            raise FederationRequestError(destination, f"not a server name: {e}") from e
        url = f"{SCHEME.decode('ascii')}://{destination}{path}"
        headers: dict[bytes | str, list[bytes | str]] = {
            "Content-Type": ["application/json"],
            "Host": [route.host_header],
        }
        data = None
        if content is not None:
            data = json.dumps(content, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        if signed:
            headers["Authorization"] = [
                sign_request(
                    self._signing_key, self._server_name, destination, method, path, content
                )
            ]
        try:
            return await self._http.request(
                method,
                url,
                data=data,
                headers=headers,
                timeout=self._config.request_timeout_seconds,
            )
        except Exception as e:
            raise FederationRequestError(destination, f"{method} {url} failed: {e!r}") from e

    async def _request(
        self, method: str, destination: str, path: str, content: Any, signed: bool
    ) -> Any:
        url = f"{SCHEME.decode('ascii')}://{destination}{path}"
        response = await self._send(method, destination, path, content, signed)
        announced = response.length if isinstance(response.length, int) else None
        if announced is not None and announced > MAX_RESPONSE_BYTES:
            response.deliverBody(_Discard())
            raise FederationRequestError(destination, f"{url} answered too much", response.code)
        try:
            # Read up to the cap and no further: a hostile server's endless
            # answer is dropped at MAX_RESPONSE_BYTES, not held in memory.
            body = await _read_at_most(response, MAX_RESPONSE_BYTES)
        except _TooLong:
            raise FederationRequestError(
                destination, f"{url} answered too much", response.code
            ) from None
        except Exception as e:
            raise FederationRequestError(destination, f"{method} {url} failed: {e!r}") from e
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            # RecursionError: nested deeper than the parser goes (a hostile
            # answer), no more JSON to us than text that is not JSON.
            answer = None
        if response.code != 200:
            raise FederationRequestError(
                destination, f"{method} {url} answered {response.code}", response.code, answer
            )
        if answer is None:
            raise FederationRequestError(destination, f"{url} answered non-JSON", response.code)
        return answer

    async def download(
        self,
        destination: str,
        path: str,
        into: IO[bytes],
        max_bytes: int,
        *,
        signed: bool = True,
        body_timeout: float = DOWNLOAD_TIMEOUT_SECONDS,
    ) -> dict[str, str]:
        """GET ``path`` on ``destination`` and write its 200 answer's body
        into ``into`` as it arrives (never all in memory); its headers
        (names in lower case, the last value of each). More than
        ``max_bytes`` (announced or received) is
        :class:`FederationResponseTooLarge`, and the connection is dropped;
        any other answer than 200 is a :class:`FederationRequestError` with
        its code and JSON body."""
        url = f"{SCHEME.decode('ascii')}://{destination}{path}"
        response = await self._send("GET", destination, path, None, signed)
        if response.code != 200:
            try:
                body = await _read_at_most(response, MAX_ERROR_BYTES)
                answer = json.loads(body)
            except Exception:
                answer = None
            raise FederationRequestError(
                destination, f"GET {url} answered {response.code}", response.code, answer
            )
        announced = response.length if isinstance(response.length, int) else None
        if announced is not None and announced > max_bytes:
            response.deliverBody(_Discard())
            raise FederationResponseTooLarge(destination, max_bytes)
        received = 0

        def write(chunk: bytes) -> None:
            nonlocal received
            received += len(chunk)
            if received > max_bytes:
                raise FederationResponseTooLarge(destination, max_bytes)
            into.write(chunk)

        try:
            await treq.collect(response, write).addTimeout(body_timeout, self._reactor)
        except FederationResponseTooLarge:
            raise
        except Exception as e:
            raise FederationRequestError(destination, f"GET {url} failed: {e!r}") from e
        return {
            name.decode("latin-1").lower(): values[-1].decode("latin-1")
            for name, values in response.headers.getAllRawHeaders()
        }


class FederationResponseTooLarge(FederationRequestError):
    """An answer larger than the caller accepts."""

    def __init__(self, destination: str, max_bytes: int) -> None:
        super().__init__(destination, f"answered more than {max_bytes} bytes")
        self.max_bytes = max_bytes


class _Discard(Protocol):
    """Takes an unwanted body: the connection is dropped at once."""

    def connectionMade(self) -> None:
        transport: Any = self.transport  # the response's producer
        if transport is not None:
            transport.stopProducing()


class _TooLong(ValueError):
    """A body longer than its reader takes."""


async def _read_at_most(response: Any, limit: int) -> bytes:
    """``response``'s body, or :class:`_TooLong` (the connection dropped)
    once more than ``limit`` bytes arrived."""
    chunks: list[bytes] = []
    size = 0

    def keep(chunk: bytes) -> None:
        nonlocal size
        size += len(chunk)
        if size > limit:
            raise _TooLong("too long")
        chunks.append(chunk)

    await treq.collect(response, keep)
    return b"".join(chunks)


def federation_tls_policy(config: FederationConfig) -> IPolicyForHTTPS:
    """How other servers' certificates are checked: the system's CAs and
    ``extra_ca_paths``; nothing at all with ``verify_certificates: false``
    (logged as a warning every time a process builds its client)."""
    if config.verify_certificates:
        return https_policy_trusting(config.extra_ca_paths)
    logger.warning(
        "federation.verify_certificates is false: the certificates of other servers are NOT"
        " checked, so anyone between us and them can impersonate any server. This is for"
        " tests only; never run a real server like this."
    )
    return NoVerificationPolicy()
