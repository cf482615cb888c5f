"""Who a client is when the router relayed its request.

The router (``synapse_lite/routing/``) adds ``X-Forwarded-For`` with the
client's address, and ``X-Synapse-Lite-Router`` with a proof that it knows the
deployment's ``worker_replication_secret``. A process believes the forwarded
address only when the proof is right: anybody else can send the header, so
rate limits keyed on the address would otherwise be trivially dodged. The
proof is derived from the secret (HMAC), not the secret itself, so a proxy
configuration holding it (``synapse-lite routes --format nginx``) cannot be
used to join replication.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress

from twisted.internet.address import IPv4Address, IPv6Address

FORWARDED_FOR = b"X-Forwarded-For"
ROUTER_PROOF = b"X-Synapse-Lite-Router"


def router_proof(secret: str) -> str:
    """What the router sends in ``X-Synapse-Lite-Router``."""
    return hmac.new(secret.encode("utf-8"), b"synapse-lite router", hashlib.sha256).hexdigest()


def forwarded_address(
    proof: bytes | None, forwarded_for: bytes | None, expected_proof: bytes | None
) -> IPv4Address | IPv6Address | None:
    """The client's address as the router gave it, or None when the request
    did not come from the router (no or wrong proof) or names no valid address.
    The router sets one address; should a list arrive, the last entry is the
    one the nearest proxy added."""
    if expected_proof is None or proof is None or forwarded_for is None:
        return None
    if not hmac.compare_digest(proof, expected_proof):
        return None
    text = forwarded_for.decode("ascii", "replace").split(",")[-1].strip()
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if address.version == 4:
        return IPv4Address("TCP", str(address), 0)
    return IPv6Address("TCP", str(address), 0)
