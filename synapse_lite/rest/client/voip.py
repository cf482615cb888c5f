"""``GET /voip/turnServer``: TURN credentials for VoIP calls.

The credentials follow the TURN REST convention coturn checks with
``use-auth-secret``: the username is ``<expiry, unix seconds>:<user id>`` and
the password is base64(HMAC-SHA1(shared secret, username)), so the TURN
server verifies them without asking us.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.config.homeserver import TurnConfig
from synapse_lite.http.server import JsonResource
from synapse_lite.rest.client._base import client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def turn_credentials(turn: TurnConfig, user_id: str, now_ms: int) -> dict[str, Any]:
    """The ``turnServer`` answer for ``user_id`` at ``now_ms``; ``{}`` when no
    TURN server is configured."""
    if not turn.uris or turn.shared_secret is None:
        return {}
    expiry = (now_ms + turn.user_lifetime_ms) // 1000
    username = f"{expiry}:{user_id}"
    digest = hmac.new(turn.shared_secret.encode(), username.encode(), hashlib.sha1).digest()
    return {
        "username": username,
        "password": base64.b64encode(digest).decode("ascii"),
        "uris": list(turn.uris),
        "ttl": turn.user_lifetime_ms // 1000,
    }


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    async def turn_server(request: Request) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        return 200, turn_credentials(handlers.turn, requester.user_id, handlers.clock.time_msec())

    resource.register_paths("GET", client_path("/voip/turnServer"), turn_server, "turn_server")
