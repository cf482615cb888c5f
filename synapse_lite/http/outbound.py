"""HTTP(S) requests to servers a user names in a request: identity servers
and pages to preview.

A user must not be able to make this server reach into the operator's
network (the cloud metadata service, a database's HTTP port, an internal
admin page). So the client resolves the host itself, refuses the request
when any address it resolves to is in ``outbound_requests.ip_range_denylist``
(and not in ``ip_range_allowlist``), and connects to an address it checked:
there is no second lookup whose answer could differ (DNS rebinding).
Redirects go through the same check. HTTPS certificates are verified against
the system's CAs and ``outbound_requests.extra_ca_paths``, for the name in
the URL.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from typing import Any

import attr
import treq
from treq.client import HTTPClient
from twisted.internet import defer, threads
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP6ClientEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.web.client import Agent, HTTPConnectionPool
from twisted.web.iweb import IAgentEndpointFactory, IPolicyForHTTPS
from zope.interface import implementer

from synapse_lite.config.outbound import OutboundRequestsConfig

#: How long one request may take, connection and answer included.
DEFAULT_TIMEOUT_SECONDS = 10.0


class OutboundRequestError(Exception):
    """A request to a user-named server was not made or did not complete:
    ``denied`` when the server is at an address this server may not reach."""

    def __init__(self, message: str, denied: bool = False) -> None:
        super().__init__(message)
        self.denied = denied


class AnswerTooLarge(OutboundRequestError):
    """The answer's body passed the caller's limit (reading stopped there)."""


@attr.s(slots=True, frozen=True, auto_attribs=True)
class OutboundAnswer:
    code: int
    headers: Mapping[str, str]
    body: bytes
    #: The URL that answered (after redirects).
    url: str

    def json(self) -> Any:
        """The body as JSON, or None when it is not."""
        try:
            return json.loads(self.body)
        except ValueError:
            return None


@implementer(IStreamClientEndpoint)
class _CheckedEndpoint:
    """Connects to ``host:port`` at an address the config allows."""

    def __init__(
        self,
        reactor: Any,
        config: OutboundRequestsConfig,
        tls_policy: IPolicyForHTTPS | None,
        host: bytes,
        port: int,
        section: str = "outbound_requests",
    ) -> None:
        self._section = section
        self._reactor = reactor
        self._config = config
        self._tls_policy = tls_policy
        self._host = host
        self._port = port

    def connect(self, protocol_factory: Any) -> defer.Deferred[Any]:
        return defer.ensureDeferred(self._connect(protocol_factory))

    async def _connect(self, protocol_factory: Any) -> Any:
        host = self._host.decode("ascii").strip("[]")
        try:
            infos = await threads.deferToThreadPool(
                self._reactor,
                self._reactor.getThreadPool(),
                socket.getaddrinfo,
                host,
                self._port,
                0,
                socket.SOCK_STREAM,
            )
        except OSError as e:
            raise OutboundRequestError(f"{host} cannot be resolved: {e}") from e
        addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        refused = [a for a in addresses if not self._config.allows_address(a)]
        if refused or not addresses:
            raise OutboundRequestError(
                f"{host} is at {', '.join(refused) or 'no address'}, which this server does"
                f" not connect to ({self._section}.ip_range_denylist)",
                denied=True,
            )
        address = addresses[0]
        endpoint_type = TCP6ClientEndpoint if ":" in address else TCP4ClientEndpoint
        endpoint: IStreamClientEndpoint = endpoint_type(
            self._reactor, address, self._port, timeout=DEFAULT_TIMEOUT_SECONDS
        )
        if self._tls_policy is not None:
            creator = self._tls_policy.creatorForNetloc(self._host, self._port)
            endpoint = wrapClientTLS(creator, endpoint)
        return await endpoint.connect(protocol_factory)


@implementer(IAgentEndpointFactory)
class _CheckedEndpoints:
    def __init__(
        self,
        reactor: Any,
        config: OutboundRequestsConfig,
        tls_policy: IPolicyForHTTPS,
        section: str,
    ) -> None:
        self._reactor = reactor
        self._config = config
        self._tls_policy = tls_policy
        self._section = section

    def endpointForURI(self, uri: Any) -> IStreamClientEndpoint:
        if uri.scheme not in (b"http", b"https"):
            raise OutboundRequestError(f"Only http and https URLs, not {uri.scheme!r}")
        policy = self._tls_policy if uri.scheme == b"https" else None
        return _CheckedEndpoint(
            self._reactor, self._config, policy, uri.host, uri.port, self._section
        )


class OutboundHttpClient:
    """Requests to user-named servers (see the module docstring)."""

    def __init__(
        self,
        reactor: Any,
        config: OutboundRequestsConfig,
        tls_policy: IPolicyForHTTPS,
        section: str = "outbound_requests",
    ) -> None:
        """``section``: the config section whose deny list a refusal names
        (federation's ``.well-known`` lookups use ``federation``'s)."""
        self._reactor = reactor
        # Nothing kept open: these servers are many and each seldom asked.
        pool = HTTPConnectionPool(reactor, persistent=False)
        endpoints = _CheckedEndpoints(reactor, config, tls_policy, section)
        self._http = HTTPClient(Agent.usingEndpointFactory(reactor, endpoints, pool=pool))

    async def request(
        self,
        method: str,
        url: str,
        *,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
        max_bytes: int = 1024 * 1024,
        truncate: bool = False,
        follow_redirects: bool = False,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> OutboundAnswer:
        """Make the request; its answer, whatever its status. Raises
        :class:`OutboundRequestError` when the server may not be or cannot
        be reached or answers late; past ``max_bytes`` of body,
        :class:`AnswerTooLarge`, or with ``truncate`` the first ``max_bytes``."""
        all_headers: dict[bytes | str, list[bytes | str]] = {
            k: [v] for k, v in (headers or {}).items()
        }
        data = None
        if json_body is not None:
            all_headers["Content-Type"] = ["application/json"]
            data = json.dumps(json_body).encode("utf-8")
        try:
            response = await self._http.request(
                method,
                url,
                data=data,
                headers=all_headers,
                timeout=timeout,
                allow_redirects=follow_redirects,
            )
        except OutboundRequestError:
            raise
        except Exception as e:
            denied = _denial_in(e)
            if denied is not None:
                raise denied from e
            raise OutboundRequestError(f"{method} {url} failed: {e}") from e
        chunks: list[bytes] = []
        size = 0

        def collect(chunk: bytes) -> None:
            nonlocal size
            chunks.append(chunk[: max(0, max_bytes - size)])
            size += len(chunk)
            if size > max_bytes:
                # Stops the reading (treq closes the connection).
                raise AnswerTooLarge(f"{url} answered more than {max_bytes} bytes")

        try:
            await treq.collect(response, collect)
        except Exception as e:
            if size <= max_bytes:
                raise OutboundRequestError(f"{method} {url}: the answer broke off: {e}") from e
            if not truncate:
                raise AnswerTooLarge(f"{url} answered more than {max_bytes} bytes") from e
        answer_headers = {
            name.decode("latin-1").lower(): values[-1].decode("latin-1")
            for name, values in response.headers.getAllRawHeaders()
        }
        final_url = response.request.absoluteURI.decode("ascii", "replace")
        return OutboundAnswer(response.code, answer_headers, b"".join(chunks), final_url)


def _denial_in(error: BaseException) -> OutboundRequestError | None:
    """The denial that failed a request, if one did (the Agent wraps what the
    endpoint raised in its own errors, sometimes several deep)."""
    seen: list[BaseException] = [error]
    while seen:
        current = seen.pop()
        if isinstance(current, OutboundRequestError):
            return current
        for reason in getattr(current, "reasons", []) or []:
            seen.append(getattr(reason, "value", reason))
        if current.__cause__ is not None:
            seen.append(current.__cause__)
    return None
