"""The Client-Server API (v3) servlets; the logic they call lives in handlers/.

Servlets are thin: they authenticate, parse and validate the request, call a
handler and shape the response. See docs/client-api.md for what is served.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from synapse_lite.http.server import JsonResource
from synapse_lite.rest.client import account, room, sync, user_data, versions

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer


def register_servlets(hs: HomeServer, resource: JsonResource) -> None:
    """Serve every client endpoint on ``resource``."""
    for module in (versions, account, room, sync, user_data):
        module.register_servlets(hs, resource)
