"""Server discovery: where a server name's federation API is reached.

The Server-Server API's "Resolving server names" steps, in order:

1. an IP literal: that address, the given port or 8448;
2. a hostname with an explicit port: that host (A/AAAA) and port;
3. ``https://<hostname>/.well-known/matrix/server`` (cached): when it names
   ``<delegated_hostname>[:<delegated_port>]``, the same steps for the
   delegated name (IP literal; explicit port; SRV ``_matrix-fed._tcp``, then
   the deprecated ``_matrix._tcp``; port 8448), with the delegated name in
   ``Host`` and the certificate;
4. otherwise SRV ``_matrix-fed._tcp.<hostname>``, then ``_matrix._tcp``,
   then ``<hostname>:8448``, with ``<hostname>`` in ``Host`` and the
   certificate.

An operator's ``federation.destinations`` entry overrides all of it.

The steps themselves are pure functions over plain values
(:func:`parse_server_name`, :func:`parse_well_known`,
:func:`well_known_cache_seconds`, :func:`order_srv_records`);
:class:`ServerDiscovery` runs them with an injected SRV resolver and
well-known fetcher, so every branch is tested without DNS or sockets.
"""

from __future__ import annotations

import email.utils
import ipaddress
import json
import logging
import random
import re
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Protocol

import attr
from twisted.internet import defer

logger = logging.getLogger(__name__)

DEFAULT_FEDERATION_PORT = 8448
#: The spec's recommended defaults for caching ``/.well-known/matrix/server``.
WELL_KNOWN_DEFAULT_CACHE_SECONDS = 24 * 3600.0
WELL_KNOWN_MAX_CACHE_SECONDS = 48 * 3600.0
#: A failed well-known lookup is cached this long the first time, doubling
#: for each failure in a row up to an hour, as the spec recommends.
WELL_KNOWN_FIRST_ERROR_CACHE_SECONDS = 120.0
WELL_KNOWN_MAX_ERROR_CACHE_SECONDS = 3600.0
#: The most of a well-known answer we read.
WELL_KNOWN_MAX_BYTES = 50 * 1024

_DNS_NAME = re.compile(r"^[A-Za-z0-9.\-]{1,255}$")


class ServerNameError(ValueError):
    """A server name (or a delegated one) does not follow the grammar."""


def parse_server_name(name: str) -> tuple[str, int | None]:
    """``(host, port or None)`` of ``host[:port]``; an IPv6 literal keeps its
    brackets. :class:`ServerNameError` when it is not a server name."""
    if not isinstance(name, str) or not name:
        raise ServerNameError("a server name must be a non-empty string")
    if name.startswith("["):
        end = name.find("]")
        if end < 0:
            raise ServerNameError(f"{name!r}: an IPv6 literal has no closing ']'")
        host, rest = name[: end + 1], name[end + 1 :]
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError as e:
            raise ServerNameError(f"{name!r}: {host} is not an IPv6 address") from e
        if rest and not rest.startswith(":"):
            raise ServerNameError(f"{name!r}: unexpected {rest!r} after the IPv6 literal")
        port_text = rest[1:] if rest else None
    else:
        host, colon, port_text_or_empty = name.partition(":")
        port_text = port_text_or_empty if colon else None
        if not _DNS_NAME.match(host):
            raise ServerNameError(f"{name!r}: {host!r} is not a hostname or IP address")
    if port_text is None:
        return host, None
    if not port_text.isdigit() or len(port_text) > 5 or not 0 < int(port_text) < 65536:
        raise ServerNameError(f"{name!r}: {port_text!r} is not a port (1-65535)")
    return host, int(port_text)


def is_ip_literal(host: str) -> bool:
    """Whether ``host`` (as :func:`parse_server_name` gives it) is an address."""
    try:
        ipaddress.ip_address(host.strip("[]") if host.startswith("[") else host)
    except ValueError:
        return False
    return True


def parse_well_known(code: int, body: bytes) -> str:
    """The ``m.server`` of a ``/.well-known/matrix/server`` answer, checked
    to be a server name; ``ValueError`` saying why it cannot be used."""
    if code != 200:
        raise ValueError(f"answered HTTP {code}")
    try:
        document = json.loads(body)
    except ValueError as e:
        raise ValueError(f"is not JSON: {e}") from e
    if not isinstance(document, dict):
        raise ValueError("is not a JSON object")
    delegated = document.get("m.server")
    if not isinstance(delegated, str):
        raise ValueError("has no string 'm.server'")
    try:
        parse_server_name(delegated)
    except ServerNameError as e:
        raise ValueError(f"'m.server' is not a server name: {e}") from e
    return delegated


def well_known_cache_seconds(headers: Mapping[str, str], now: float) -> float:
    """How long a well-known answer is cached: its ``Cache-Control``
    ``max-age`` (``no-store``/``no-cache``: 0), else its ``Expires``, else
    24 hours; never more than 48 hours. ``headers`` have lower-case names."""
    cache_control = headers.get("cache-control", "")
    for directive in (d.strip().lower() for d in cache_control.split(",")):
        if directive in ("no-store", "no-cache"):
            return 0.0
        if directive.startswith("max-age="):
            value = directive[len("max-age=") :].strip('"')
            if value.isdigit():
                return min(float(value), WELL_KNOWN_MAX_CACHE_SECONDS)
    expires = headers.get("expires")
    if expires:
        try:
            when = email.utils.parsedate_to_datetime(expires).timestamp()
        except (TypeError, ValueError):
            # An unparseable Expires means "already expired" (RFC 9111).
            return 0.0
        return min(max(when - now, 0.0), WELL_KNOWN_MAX_CACHE_SECONDS)
    return WELL_KNOWN_DEFAULT_CACHE_SECONDS


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SrvRecord:
    priority: int
    weight: int
    target: str
    port: int


def order_srv_records(records: list[SrvRecord], rng: random.Random) -> list[tuple[str, int]]:
    """``(host, port)`` to try in turn (RFC 2782): lowest priority first,
    within one priority a weighted random order. A lone record with target
    ``.`` means "no such service": nothing."""
    usable = [r for r in records if r.target not in (".", "")]
    ordered: list[tuple[str, int]] = []
    for priority in sorted({r.priority for r in usable}):
        group = [r for r in usable if r.priority == priority]
        while group:
            total = sum(r.weight for r in group)
            if total == 0:
                chosen = group[0]
            else:
                point = rng.randint(1, total)
                for chosen in group:
                    point -= chosen.weight
                    if point <= 0:
                        break
            group.remove(chosen)
            ordered.append((chosen.target.rstrip("."), chosen.port))
    return ordered


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Route:
    """How to reach a server: the hosts (names or addresses) and ports to
    connect to in turn, what to send as ``Host``, and the name its
    certificate must be for (and the SNI, unless it is an address)."""

    scheme: str
    targets: tuple[tuple[str, int], ...]
    host_header: str
    tls_name: str
    #: An operator's ``destinations`` entry: its addresses are not checked.
    operator_named: bool = False


@attr.s(slots=True, frozen=True, auto_attribs=True)
class WellKnownAnswer:
    code: int
    body: bytes
    #: Lower-case names.
    headers: Mapping[str, str]


class SrvResolver(Protocol):
    async def lookup_srv(self, name: str) -> list[SrvRecord]:
        """The SRV records of ``name``; none when there are none."""


class WellKnownFetcher(Protocol):
    async def fetch(self, hostname: str) -> WellKnownAnswer:
        """``GET https://<hostname>/.well-known/matrix/server`` following
        redirects; raises when no answer could be had."""


@attr.s(slots=True, auto_attribs=True)
class _CachedWellKnown:
    delegated: str | None
    expires_at: float
    failures: int = 0


class ServerDiscovery:
    """Resolves server names to :class:`Route` s (see the module docstring)."""

    def __init__(
        self,
        *,
        clock_time: Callable[[], float],
        srv: SrvResolver,
        well_known: WellKnownFetcher,
        overrides: Mapping[str, str] | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._time = clock_time
        self._srv = srv
        self._well_known = well_known
        #: server name -> base URL (``federation.destinations``), read at
        #: each lookup so a changed mapping applies at once.
        self._overrides = overrides if overrides is not None else {}
        self._rng = rng or random.Random()
        self._well_known_cache: dict[str, _CachedWellKnown] = {}
        self._in_flight: dict[str, list[defer.Deferred[str | None]]] = {}

    async def resolve(self, server_name: str) -> Route:
        """Where ``server_name`` is; :class:`ServerNameError` if it is not one."""
        override = self._overrides.get(server_name)
        if override is not None:
            return route_from_base_url(override)
        host, port = parse_server_name(server_name)
        if is_ip_literal(host):
            return _direct(host, port, server_name)
        if port is not None:
            return _direct(host, port, server_name)
        delegated = await self._delegation(host)
        if delegated is not None:
            d_host, d_port = parse_server_name(delegated)
            if is_ip_literal(d_host) or d_port is not None:
                return _direct(d_host, d_port, delegated)
            return await self._by_srv(d_host)
        return await self._by_srv(host)

    async def _by_srv(self, hostname: str) -> Route:
        for service in ("_matrix-fed._tcp", "_matrix._tcp"):
            name = f"{service}.{hostname}"
            try:
                records = await self._srv.lookup_srv(name)
            except Exception as e:
                logger.info("SRV lookup of %s failed: %s", name, e)
                records = []
            targets = order_srv_records(records, self._rng)
            if targets:
                if service == "_matrix._tcp":
                    logger.info("%s uses the deprecated SRV record %s", hostname, name)
                return Route("https", tuple(targets), hostname, hostname)
        return Route("https", ((hostname, DEFAULT_FEDERATION_PORT),), hostname, hostname)

    async def _delegation(self, hostname: str) -> str | None:
        now = self._time()
        cached = self._well_known_cache.get(hostname)
        if cached is not None and cached.expires_at > now:
            return cached.delegated
        # Requests to one server at once share one well-known fetch.
        waiting = self._in_flight.get(hostname)
        if waiting is not None:
            waiter: defer.Deferred[str | None] = defer.Deferred()
            waiting.append(waiter)
            return await waiter
        self._in_flight[hostname] = []
        delegated: str | None = None
        try:
            delegated = await self._fetch_delegation(hostname, now, cached)
        finally:
            for waiter in self._in_flight.pop(hostname):
                waiter.callback(delegated)
        return delegated

    async def _fetch_delegation(
        self, hostname: str, now: float, cached: _CachedWellKnown | None
    ) -> str | None:
        failures = cached.failures if cached is not None and cached.delegated is None else 0
        try:
            answer = await self._well_known.fetch(hostname)
            delegated = parse_well_known(answer.code, answer.body)
        except Exception as e:
            failures += 1
            period = min(
                WELL_KNOWN_FIRST_ERROR_CACHE_SECONDS * 2 ** (failures - 1),
                WELL_KNOWN_MAX_ERROR_CACHE_SECONDS,
            )
            logger.info(
                "No delegation for %s: https://%s/.well-known/matrix/server %s"
                " (using SRV or port %d; asking again in %ds)",
                hostname,
                hostname,
                e,
                DEFAULT_FEDERATION_PORT,
                period,
            )
            self._well_known_cache[hostname] = _CachedWellKnown(None, now + period, failures)
            return None
        period = well_known_cache_seconds(answer.headers, now)
        logger.info("%s delegates federation to %s (cached %ds)", hostname, delegated, period)
        self._well_known_cache[hostname] = _CachedWellKnown(delegated, now + period)
        return delegated


def _direct(host: str, port: int | None, name: str) -> Route:
    """Steps 1, 2, 3.1 and 3.2: that host and port, ``name`` as ``Host``."""
    bare = host[1:-1] if host.startswith("[") else host
    return Route("https", ((bare, port or DEFAULT_FEDERATION_PORT),), name, bare)


def route_from_base_url(url: str) -> Route:
    """The route of an operator's ``destinations`` entry (``http(s)://host[:port]``,
    checked at config load)."""
    parsed = urllib.parse.urlsplit(url)
    scheme = parsed.scheme
    host = parsed.hostname or ""
    port = parsed.port or (443 if scheme == "https" else 80)
    return Route(scheme, ((host, port),), parsed.netloc, host, operator_named=True)
