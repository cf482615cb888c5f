"""``GET /_matrix/client/versions`` and ``GET /capabilities``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.http.server import JsonResource

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

SUPPORTED_VERSIONS = ["r0.6.1", "v1.1", "v1.2", "v1.3", "v1.4", "v1.5", "v1.6"]


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    async def on_get(request: Request) -> tuple[int, Any]:
        return 200, {"versions": SUPPORTED_VERSIONS, "unstable_features": {}}

    async def capabilities(request: Request) -> tuple[int, Any]:
        await handlers.auth.get_user_by_req(request)
        return 200, {
            "capabilities": {
                "m.change_password": {"enabled": True},
                # No identity server: 3PIDs can be neither added nor removed.
                "m.3pid_changes": {"enabled": False},
                "m.room_versions": {"default": "10", "available": {"10": "stable"}},
            }
        }

    resource.register_paths("GET", "/_matrix/client/versions", on_get, "versions")
    resource.register_paths(
        "GET", "/_matrix/client/(?:r0|v3)/capabilities", capabilities, "capabilities"
    )
