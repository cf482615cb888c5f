"""``GET /_synapse/admin/v1/server_version``: answered without a token (the
admin UI asks before logging in)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite import __version__
from synapse_lite.http.server import JsonResource
from synapse_lite.rest.admin._base import admin_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    async def server_version(request: Request) -> tuple[int, Any]:
        return 200, {"server_version": f"synapse_lite {__version__}"}

    resource.register_paths(
        "GET", admin_path("v1", "/server_version"), server_version, "admin_server_version"
    )
