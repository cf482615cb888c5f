"""What the client servlets share: path patterns and the caller's address."""

from __future__ import annotations

from twisted.web.server import Request

CLIENT_PREFIX = "/_matrix/client/(?:r0|v3)"


def client_path(pattern: str) -> str:
    """A v3 (or legacy r0) client API path pattern."""
    return CLIENT_PREFIX + pattern


def unstable_client_path(pattern: str) -> str:
    """The ``unstable`` path of an endpoint that was served there before a
    spec version took it in (clients written then still call it)."""
    return "/_matrix/client/unstable" + pattern


def client_ip(request: Request) -> str:
    """The address rate limits before login are keyed on."""
    address = request.getClientAddress()
    return str(getattr(address, "host", "unknown"))
