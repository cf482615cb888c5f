"""Connections to other homeservers: discovery, address checks, TLS.

Requests go to ``matrix-federation://<server name>/path``; this module's
endpoint factory turns the server name into a connection:
:class:`~synapse_lite.federation.discovery.ServerDiscovery` gives the hosts
and ports to try and the name the certificate must be for; each host is
resolved here (A/AAAA), addresses in ``federation.ip_range_denylist`` and not
in ``ip_range_allowlist`` are dropped (a server name is anyone's to choose:
it must not make us reach into the operator's network), and the connection
goes to an address that was checked (no second lookup whose answer could
differ). TLS sends the certificate's name as SNI, unless it is an address.

An operator's ``federation.destinations`` entry is trusted as written: no
address check, and ``http://`` is allowed (loopback tests, private setups).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from OpenSSL import SSL
from twisted.internet import defer, threads
from twisted.internet.abstract import isIPAddress, isIPv6Address
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP6ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import IOpenSSLClientConnectionCreator, IStreamClientEndpoint
from twisted.names import client as dns_client
from twisted.names import dns
from twisted.names.error import DNSNameError, DNSServerError
from twisted.web.iweb import IAgentEndpointFactory, IPolicyForHTTPS
from zope.interface import implementer

from synapse_lite.config.outbound import OutboundRequestsConfig
from synapse_lite.federation.discovery import (
    WELL_KNOWN_MAX_BYTES,
    ServerDiscovery,
    SrvRecord,
    WellKnownAnswer,
)
from synapse_lite.http.outbound import OutboundHttpClient

logger = logging.getLogger(__name__)

SCHEME = b"matrix-federation"
#: How long "no such SRV record" is believed.
NEGATIVE_SRV_CACHE_SECONDS = 300.0
#: How long a lookup that failed (timed out) counts as "no record".
FAILED_SRV_CACHE_SECONDS = 60.0
AddressResolver = Callable[[str, int], Awaitable[list[str]]]


class FederationConnectError(Exception):
    """A server could not be connected to; ``denied`` when every address it
    is at is one we may not reach."""

    def __init__(self, message: str, denied: bool = False) -> None:
        super().__init__(message)
        self.denied = denied


def system_address_resolver(reactor: Any) -> AddressResolver:
    """The system's resolver (A/AAAA, following CNAMEs), off the reactor thread."""

    async def resolve(host: str, port: int) -> list[str]:
        infos = await threads.deferToThreadPool(
            reactor, reactor.getThreadPool(), socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM
        )
        return list(dict.fromkeys(str(info[4][0]) for info in infos))

    return resolve


class TwistedSrvResolver:
    """SRV lookups with ``twisted.names`` (the name servers of
    ``/etc/resolv.conf``), each answer cached for its smallest TTL (a missing
    record for :data:`NEGATIVE_SRV_CACHE_SECONDS`) without timers of its own."""

    def __init__(self, reactor: Any, resolver: Any = None) -> None:
        """``resolver``: a ``twisted.names`` resolver (tests); by default
        one made at the first lookup."""
        self._reactor = reactor
        self._resolver: Any = resolver
        self._cache: dict[str, tuple[float, list[SrvRecord]]] = {}

    async def lookup_srv(self, name: str) -> list[SrvRecord]:
        now = self._reactor.seconds()
        cached = self._cache.get(name)
        if cached is not None and cached[0] > now:
            return cached[1]
        if self._resolver is None:
            self._resolver = dns_client.Resolver(
                resolv="/etc/resolv.conf", timeout=(1, 3), reactor=self._reactor
            )
        try:
            answers, _, _ = await self._resolver.lookupService(name)
        except (DNSNameError, DNSServerError):
            self._cache[name] = (now + NEGATIVE_SRV_CACHE_SECONDS, [])
            return []
        except Exception as e:
            # A name server that does not answer must not cost every request
            # its timeouts: believe "no record" for a while.
            logger.info("SRV lookup of %s failed (%r): taken as no record", name, e)
            self._cache[name] = (now + FAILED_SRV_CACHE_SECONDS, [])
            return []
        srv = [a for a in answers if a.type == dns.SRV]
        records = [
            SrvRecord(a.payload.priority, a.payload.weight, str(a.payload.target), a.payload.port)
            for a in srv
        ]
        ttl = min((a.ttl for a in srv), default=NEGATIVE_SRV_CACHE_SECONDS)
        self._cache[name] = (now + ttl, records)
        return records

    def close(self) -> None:
        """Stop re-reading ``/etc/resolv.conf`` (the resolver's one timer)."""
        call = getattr(self._resolver, "_parseCall", None)
        if call is not None and call.active():
            call.cancel()


class HttpsWellKnownFetcher:
    """``/.well-known/matrix/server`` over HTTPS, through the same address
    checks and certificate checks as federation requests."""

    def __init__(self, http: OutboundHttpClient, timeout: float) -> None:
        self._http = http
        self._timeout = timeout

    async def fetch(self, hostname: str) -> WellKnownAnswer:
        answer = await self._http.request(
            "GET",
            f"https://{hostname}/.well-known/matrix/server",
            max_bytes=WELL_KNOWN_MAX_BYTES,
            # treq's redirect agent stops after 20 hops: a loop ends there.
            follow_redirects=True,
            timeout=self._timeout,
        )
        return WellKnownAnswer(answer.code, answer.body, answer.headers)


@implementer(IPolicyForHTTPS)
class NoVerificationPolicy:
    """TLS that checks nothing: ``federation.verify_certificates: false``,
    for tests only. Still sends SNI."""

    def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
        return _UncheckedCreator(hostname.decode("ascii"))


@implementer(IOpenSSLClientConnectionCreator)
class _UncheckedCreator:
    def __init__(self, host: str) -> None:
        self._host = host

    def clientConnectionForTLS(self, tls_protocol: Any) -> Any:
        context = SSL.Context(SSL.TLS_CLIENT_METHOD)
        context.set_verify(SSL.VERIFY_NONE, lambda *args: True)
        connection = SSL.Connection(context, None)
        connection.set_app_data(tls_protocol)
        if not (isIPAddress(self._host) or isIPv6Address(self._host)):
            connection.set_tlsext_host_name(self._host.encode("idna"))
        connection.set_connect_state()
        return connection


@implementer(IAgentEndpointFactory)
class FederationEndpoints:
    """The Agent's endpoints for ``matrix-federation://`` URLs."""

    def __init__(
        self,
        *,
        reactor: Any,
        discovery: ServerDiscovery,
        address_filter: OutboundRequestsConfig,
        tls_policy: IPolicyForHTTPS,
        resolve_addresses: AddressResolver,
        connect_timeout: float,
    ) -> None:
        self._reactor = reactor
        self._discovery = discovery
        self._filter = address_filter
        self._tls_policy = tls_policy
        self._resolve = resolve_addresses
        self._timeout = connect_timeout

    def endpointForURI(self, uri: Any) -> IStreamClientEndpoint:
        if uri.scheme != SCHEME:
            raise FederationConnectError(f"not a federation URL: {uri.toBytes()!r}")
        return _FederationEndpoint(self, uri.netloc.decode("ascii"))

    async def connect(self, server_name: str, protocol_factory: Any) -> Any:
        route = await self._discovery.resolve(server_name)
        checked = not route.operator_named
        problems: list[str] = []
        denied: list[str] = []
        for host, port in route.targets:
            try:
                addresses = [host] if _is_address(host) else await self._resolve(host, port)
            except OSError as e:
                problems.append(f"{host} cannot be resolved: {e}")
                continue
            for address in addresses:
                if checked and not self._filter.allows_address(address):
                    denied.append(f"{host} at {address}")
                    continue
                endpoint_type = TCP6ClientEndpoint if ":" in address else TCP4ClientEndpoint
                endpoint: IStreamClientEndpoint = endpoint_type(
                    self._reactor, address, port, timeout=self._timeout
                )
                if route.scheme == "https":
                    name = route.tls_name.encode("ascii")
                    creator = self._tls_policy.creatorForNetloc(name, port)
                    endpoint = wrapClientTLS(creator, endpoint)
                try:
                    return await endpoint.connect(protocol_factory)
                except Exception as e:
                    problems.append(f"{address}:{port}: {e}")
        if denied and not problems:
            raise FederationConnectError(
                f"{server_name} is at {', '.join(denied)}, which federation does not connect"
                " to (federation.ip_range_denylist; allow it with ip_range_allowlist)",
                denied=True,
            )
        raise FederationConnectError(
            f"{server_name} could not be reached: {'; '.join(problems + denied) or 'no address'}"
        )


@implementer(IStreamClientEndpoint)
class _FederationEndpoint:
    def __init__(self, endpoints: FederationEndpoints, server_name: str) -> None:
        self._endpoints = endpoints
        self._server_name = server_name

    def connect(self, protocol_factory: Any) -> defer.Deferred[Any]:
        return defer.ensureDeferred(self._endpoints.connect(self._server_name, protocol_factory))


def _is_address(host: str) -> bool:
    return bool(isIPAddress(host) or isIPv6Address(host))
