"""The ``outbound_requests`` section: how this server reaches servers that
users point it at (push gateways, identity servers, pages to preview).

Those are reached over HTTPS with certificate verification against the
system's trusted CAs; ``extra_ca_paths`` adds CAs of the operator's (a
private gateway's, or a test suite's) without turning verification off for
anyone else. Each file is read and parsed when the config is loaded, so a
wrong path or a file that is not a PEM certificate stops the server at start
rather than failing every request later.

Identity servers and pages to preview are named in a user's request: the
server refuses to connect to them at an address in ``ip_range_denylist``
(by default private, loopback, link-local and other non-public ranges), so
a user cannot make it reach into the operator's network, unless the address
is also in ``ip_range_allowlist``. Push gateways are not subject to it (see
docs/push.md).
"""

from __future__ import annotations

import ipaddress
import os

import attr
from cryptography import x509

from synapse_lite.config.validation import Section

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Addresses that are not the public internet: this host, private networks,
#: link-local, carrier-grade NAT, multicast, documentation and reserved
#: ranges, and their IPv6 counterparts (including IPv4-mapped addresses).
DEFAULT_IP_RANGE_DENYLIST = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "255.255.255.255/32",
    "::/128",
    "::1/128",
    "::ffff:0:0/96",
    "64:ff9b::/96",
    "100::/64",
    "2001:db8::/32",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class OutboundRequestsConfig:
    """Settings of requests to servers users name (``outbound_requests``)."""

    #: PEM files, each holding one or more CA certificates trusted besides
    #: the system's (absolute paths).
    extra_ca_paths: tuple[str, ...] = ()
    ip_range_denylist: tuple[IpNetwork, ...] = tuple(
        ipaddress.ip_network(r) for r in DEFAULT_IP_RANGE_DENYLIST
    )
    ip_range_allowlist: tuple[IpNetwork, ...] = ()

    def allows_address(self, address: str) -> bool:
        """Whether a user-named destination may be reached at ``address``."""
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if any(ip in network for network in self.ip_range_allowlist):
            return True
        mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
        return not any(
            ip in network or (mapped is not None and mapped in network)
            for network in self.ip_range_denylist
        )

    @classmethod
    def read(cls, section: Section, base_dir: str) -> OutboundRequestsConfig:
        result = cls(
            extra_ca_paths=read_ca_paths(section, "extra_ca_paths", base_dir),
            ip_range_denylist=read_networks(
                section, "ip_range_denylist", list(DEFAULT_IP_RANGE_DENYLIST)
            ),
            ip_range_allowlist=read_networks(section, "ip_range_allowlist", []),
        )
        section.finish()
        return result


def read_ca_paths(section: Section, key: str, base_dir: str) -> tuple[str, ...]:
    """A list of PEM files of CA certificates (one may be given as a string),
    relative to ``base_dir``: each read and parsed now, a problem recorded
    for each that cannot be used."""
    paths: list[str] = []
    for index, value in enumerate(section.get_str_list(key, [], allow_single=True)):
        path = os.path.join(base_dir, value)
        problem = _pem_certificates_problem(path)
        if problem is not None:
            section.problem(problem, f"{key}[{index}]")
        paths.append(path)
    return tuple(paths)


def read_networks(section: Section, key: str, default: list[str]) -> tuple[IpNetwork, ...]:
    """A list of IP addresses or CIDR ranges; a problem recorded for each bad one."""
    networks = []
    for index, value in enumerate(section.get_str_list(key, default)):
        try:
            networks.append(ipaddress.ip_network(value, strict=False))
        except ValueError:
            section.problem(
                f"{value!r} is not an IP address or range (CIDR, e.g. 10.0.0.0/8)",
                f"{key}[{index}]",
            )
    return tuple(networks)


def read_pem_certificates(path: str) -> list[x509.Certificate]:
    """Every certificate of a PEM file; raises ``OSError`` or ``ValueError``."""
    with open(path, "rb") as f:
        return x509.load_pem_x509_certificates(f.read())


def _pem_certificates_problem(path: str) -> str | None:
    try:
        read_pem_certificates(path)
    except OSError as e:
        return f"cannot read {path}: {e.strerror}"
    except ValueError:
        return f"{path} holds no PEM certificate ('-----BEGIN CERTIFICATE-----')"
    return None
