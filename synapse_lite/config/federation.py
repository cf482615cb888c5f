"""The ``federation`` section: where other servers are, and how hard to try.

Other servers are found as the spec says (``federation/discovery.py``:
``.well-known``, SRV, port 8448); ``destinations`` maps a server name to the
base URL its federation API is served at, overriding discovery (how loopback
tests and private deployments reach servers, even over plain HTTP).

Certificates of other servers are checked against the system's CAs, and
``extra_ca_paths`` adds CAs of the operator's: a private federation whose
servers' certificates come from its own CA (or a test suite's, as SyTest's)
is reached over HTTPS with verification on. ``verify_certificates: false``
turns checking off, for tests only, and is logged as a warning by every
process that starts with it.

Discovered servers at an address in ``ip_range_denylist`` (by default the
same non-public ranges as ``outbound_requests``) and not in
``ip_range_allowlist`` are not connected to.

``well_known_server`` and ``well_known_client``, when set, are served at
``/.well-known/matrix/server`` and ``/.well-known/matrix/client``.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from typing import Any

import attr

from synapse_lite.config.outbound import (
    DEFAULT_IP_RANGE_DENYLIST,
    IpNetwork,
    OutboundRequestsConfig,
    read_ca_paths,
    read_networks,
)
from synapse_lite.config.validation import Section
from synapse_lite.federation.crypto import decode_base64
from synapse_lite.federation.discovery import ServerNameError, parse_server_name


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RetryConfig:
    """Backoff towards a destination that failed: ``initial_seconds`` after
    the first failure, doubling (with jitter) up to ``max_seconds``; reported
    down after ``down_after_failures`` failures in a row."""

    initial_seconds: float = 1.0
    max_seconds: float = 3600.0
    down_after_failures: int = 3

    @classmethod
    def read(cls, section: Section) -> RetryConfig:
        result = cls(
            initial_seconds=section.get_float("initial_seconds", 1.0, minimum=0.01),
            max_seconds=section.get_float("max_seconds", 3600.0, minimum=0.01),
            down_after_failures=section.get_int("down_after_failures", 3, minimum=1),
        )
        if result.max_seconds < result.initial_seconds:
            section.problem("must not be below initial_seconds", "max_seconds")
        section.finish()
        return result


@attr.s(slots=True, frozen=True, auto_attribs=True)
class TrustedKeyServer:
    """A notary asked for other servers' keys when they cannot be fetched
    from the servers themselves; its answers must carry its signature by one
    of ``verify_keys`` (``key_id -> base64``), or, when none are given, by a
    key it publishes itself."""

    server_name: str
    verify_keys: dict[str, str] = attr.ib(factory=dict, hash=False)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class FederationConfig:
    """How this server talks to others."""

    destinations: dict[str, str] = attr.ib(factory=dict, hash=False)
    request_timeout_seconds: float = 30.0
    #: How long the key document we publish says our key is valid.
    key_validity_seconds: float = 86400.0
    retry: RetryConfig = attr.ib(factory=RetryConfig)
    #: PEM files of CA certificates trusted for other servers' certificates,
    #: besides the system's (absolute paths).
    extra_ca_paths: tuple[str, ...] = ()
    #: False only in tests: other servers' certificates are then not checked.
    verify_certificates: bool = True
    ip_range_denylist: tuple[IpNetwork, ...] = tuple(
        ipaddress.ip_network(r) for r in DEFAULT_IP_RANGE_DENYLIST
    )
    ip_range_allowlist: tuple[IpNetwork, ...] = ()
    #: ``m.server`` of the ``/.well-known/matrix/server`` we serve (None: 404).
    well_known_server: str | None = None
    #: The ``/.well-known/matrix/client`` document we serve (None: 404).
    well_known_client: dict[str, Any] | None = attr.ib(default=None, hash=False)
    #: Notaries asked when a server's own key endpoint fails (none by default).
    trusted_key_servers: tuple[TrustedKeyServer, ...] = ()
    #: Our keys of the past, published as ``old_verify_keys``:
    #: ``key_id -> (base64 verify key, expired_ts)``.
    old_verify_keys: dict[str, tuple[str, int]] = attr.ib(factory=dict, hash=False)

    @property
    def address_filter(self) -> OutboundRequestsConfig:
        """The address checks (and extra CAs) of discovered servers, in the
        shape the outbound HTTP client takes (for ``.well-known`` lookups)."""
        return OutboundRequestsConfig(
            extra_ca_paths=self.extra_ca_paths,
            ip_range_denylist=self.ip_range_denylist,
            ip_range_allowlist=self.ip_range_allowlist,
        )

    @classmethod
    def read(cls, section: Section, base_dir: str = "") -> FederationConfig:
        destinations: dict[str, str] = {}
        mapping = section.get_section("destinations")
        for name in mapping.keys():
            url = mapping.get_str(name)
            if not isinstance(url, str):
                continue
            problem = check_base_url(url)
            if problem:
                mapping.problem(problem, name)
            else:
                destinations[name] = url.rstrip("/")
        result = cls(
            destinations=destinations,
            request_timeout_seconds=section.get_float("request_timeout_seconds", 30.0, minimum=0.1),
            key_validity_seconds=section.get_float("key_validity_seconds", 86400.0, minimum=60.0),
            retry=RetryConfig.read(section.get_section("retry")),
            extra_ca_paths=read_ca_paths(section, "extra_ca_paths", base_dir),
            verify_certificates=section.get_bool("verify_certificates", True),
            ip_range_denylist=read_networks(
                section, "ip_range_denylist", list(DEFAULT_IP_RANGE_DENYLIST)
            ),
            ip_range_allowlist=read_networks(section, "ip_range_allowlist", []),
            well_known_server=_read_well_known_server(section),
            well_known_client=_read_well_known_client(section),
            trusted_key_servers=_read_trusted_key_servers(section),
            old_verify_keys=_read_old_verify_keys(section.get_section("old_verify_keys")),
        )
        section.finish()
        return result


def _read_trusted_key_servers(section: Section) -> tuple[TrustedKeyServer, ...]:
    result = []
    for item in section.get_list_of_sections("trusted_key_servers", []):
        name = item.get_str("server_name")
        try:
            parse_server_name(name)
        except ServerNameError as e:
            item.problem(str(e), "server_name")
        keys_section = item.get_section("verify_keys")
        keys: dict[str, str] = {}
        for key_id in keys_section.keys():
            value = keys_section.get_str(key_id)
            if not key_id.startswith("ed25519:"):
                keys_section.problem("key ids are 'ed25519:<version>'", key_id)
            elif _verify_key_problem(value):
                keys_section.problem(_verify_key_problem(value) or "", key_id)
            else:
                keys[key_id] = value
        item.finish()
        result.append(TrustedKeyServer(name, keys))
    return tuple(result)


def _read_old_verify_keys(section: Section) -> dict[str, tuple[str, int]]:
    result: dict[str, tuple[str, int]] = {}
    for key_id in section.keys():
        entry = section.get_section(key_id)
        key = entry.get_str("key")
        expired = entry.get_int("expired_ts", minimum=0)
        entry.finish()
        if not key_id.startswith("ed25519:"):
            section.problem("key ids are 'ed25519:<version>'", key_id)
        elif _verify_key_problem(key):
            entry.problem(_verify_key_problem(key) or "", "key")
        else:
            result[key_id] = (key, expired)
    return result


def _verify_key_problem(value: str) -> str | None:
    try:
        raw = decode_base64(value)
    except Exception:
        return f"{value!r} is not unpadded base64"
    if len(raw) != 32:
        return "an ed25519 verify key is 32 bytes (43 base64 characters)"
    return None


def _read_well_known_server(section: Section) -> str | None:
    value = section.get_optional_str("well_known_server")
    if value is None:
        return None
    try:
        parse_server_name(value)
    except ServerNameError as e:
        section.problem(f"must be a server name, host[:port]: {e}", "well_known_server")
        return None
    return value


def _read_well_known_client(section: Section) -> dict[str, Any] | None:
    if section.data.get("well_known_client") is None:
        section.accept("well_known_client")
        return None
    document = section.get_section("well_known_client")
    document.keys()  # served as written: every key is the operator's
    value = document.data
    base_url = value.get("m.homeserver")
    if not isinstance(base_url, dict) or not isinstance(base_url.get("base_url"), str):
        section.problem(
            "must be a mapping with m.homeserver.base_url (and any other keys to serve)",
            "well_known_client",
        )
        return None
    problem = check_base_url(base_url["base_url"].rstrip("/"))
    if problem:
        section.problem(problem, "well_known_client.m.homeserver.base_url")
        return None
    return value


def check_base_url(url: str) -> str | None:
    """Why ``url`` cannot be a destination's base URL, or None."""
    try:
        parsed = urllib.parse.urlsplit(url)
        port = parsed.port
    except ValueError as e:
        return f"is not a URL: {e}"
    if parsed.scheme not in ("http", "https"):
        return f"must be an http:// or https:// URL, not {url!r}"
    if not parsed.hostname:
        return f"has no host: {url!r}"
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment:
        return f"must be a base URL (scheme, host, port) without a path: {url!r}"
    if port == 0:
        return "port must not be 0"
    return None
