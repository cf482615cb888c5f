"""The ``federation`` section: where other servers are, and how hard to try.

``destinations`` maps a server name to the base URL its federation API is
served at. Without an entry a server name ``host[:port]`` means
``https://host:port`` (port 8448 by default); .well-known and SRV discovery are
not implemented. HTTPS uses Twisted's TLS with certificate verification, which
needs ``pip install 'twisted[tls]'``. The mapping is how loopback tests (and
private deployments) reach servers over plain HTTP.

Certificates of other servers are checked against the system's CAs, and
``extra_ca_paths`` adds CAs of the operator's: a private federation whose
servers' certificates come from its own CA (or a test suite's, as SyTest's)
is reached over HTTPS with verification on.
"""

from __future__ import annotations

import urllib.parse

import attr

from synapse_lite.config.outbound import read_ca_paths
from synapse_lite.config.validation import Section


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
        )
        section.finish()
        return result

    def base_url(self, server_name: str) -> str:
        """Where ``server_name``'s federation and key APIs are served."""
        mapped = self.destinations.get(server_name)
        if mapped is not None:
            return mapped
        host, _, port = server_name.rpartition(":")
        if not host or not port.isdigit() or host.endswith(":"):
            # No port (or a bare IPv6 literal): the federation default.
            return f"https://{server_name}:8448"
        return f"https://{server_name}"


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
