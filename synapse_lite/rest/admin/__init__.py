"""The admin API (``/_synapse/admin/...``), with the paths, parameters and
answers of the reference homeserver's, so the admin UIs and moderation bots
written for it work unchanged. Every endpoint but ``server_version`` is for
server admins only (403 ``M_FORBIDDEN`` otherwise). Served with the client
API (the routing table reads these servlets with the client ones);
``docs/admin-api.md`` lists what is served and where.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from synapse_lite.rest.admin import (
    federation,
    media,
    registration_tokens,
    reports,
    rooms,
    server,
    users,
)

if TYPE_CHECKING:
    from synapse_lite.http.server import JsonResource
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    """Serve every admin endpoint on ``resource``."""
    for module in (server, users, rooms, reports, registration_tokens, media, federation):
        module.register_servlets(handlers, resource)
