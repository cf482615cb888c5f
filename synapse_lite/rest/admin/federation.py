"""The admin API's federation destinations, read from ``destinations``:
``GET /v1/federation/destinations``, ``GET
/v1/federation/destinations/{destination}`` and its ``/rooms``, ``POST
.../reset_connection``; and ``GET
/v1/background_updates/status`` (this server has no background updates:
schema changes are applied at start)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.http.server import (
    JsonResource,
    parse_json_object_from_request,
    query_int,
    query_string,
)
from synapse_lite.rest.admin._base import MAX_PAGE, admin_path, query_choice, query_descending
from synapse_lite.storage.databases.main.admin import DESTINATION_ORDERINGS

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    admin = handlers.admin

    async def list_destinations(request: Request) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        offset = query_int(request, "from", 0)
        limit = query_int(request, "limit", 100, minimum=1, maximum=MAX_PAGE)
        assert offset is not None and limit is not None
        return 200, await admin.destinations(
            offset,
            limit,
            query_choice(request, "order_by", list(DESTINATION_ORDERINGS), "destination"),
            query_descending(request),
            query_string(request, "destination"),
        )

    async def get_destination(request: Request, destination: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await admin.destination(destination)

    async def destination_rooms(request: Request, destination: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        offset = query_int(request, "from", 0)
        limit = query_int(request, "limit", 100, minimum=1, maximum=MAX_PAGE)
        assert offset is not None and limit is not None
        return 200, await admin.destination_rooms(
            destination, offset, limit, query_descending(request)
        )

    async def reset_connection(request: Request, destination: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        parse_json_object_from_request(request, allow_empty=True)
        await admin.reset_connection(requester, destination)
        return 200, {}

    async def background_updates(request: Request) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        # Schema deltas run before a process serves: nothing runs behind it.
        return 200, {"enabled": False, "current_updates": {}}

    register = resource.register_paths
    destinations = admin_path("v1", "/federation/destinations")
    register("GET", destinations, list_destinations, "admin_destinations")
    one = destinations + "/(?P<destination>[^/]+)"
    register("GET", one, get_destination, "admin_destination")
    register("GET", one + "/rooms", destination_rooms, "admin_destination_rooms")
    register("POST", one + "/reset_connection", reset_connection, "admin_reset_connection")
    register(
        "GET",
        admin_path("v1", "/background_updates/status"),
        background_updates,
        "admin_background_updates",
    )
