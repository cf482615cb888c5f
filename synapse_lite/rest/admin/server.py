"""``GET /_synapse/admin/v1/server_version``: answered without a token (the
admin UI asks before logging in); ``POST /v1/send_server_notice[/{txnId}]``;
``GET /v1/scheduled_tasks`` (the long jobs) and ``GET
/v1/statistics/database/rooms``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite import __version__
from synapse_lite.api.identifiers import check_identifier_text
from synapse_lite.http.server import (
    JsonResource,
    parse_json_object_from_request,
    query_int,
    query_string,
)
from synapse_lite.rest.admin._base import admin_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    async def server_version(request: Request) -> tuple[int, Any]:
        return 200, {"server_version": f"synapse_lite {__version__}"}

    resource.register_paths(
        "GET", admin_path("v1", "/server_version"), server_version, "admin_server_version"
    )

    async def send_server_notice(request: Request, txn_id: str | None = None) -> tuple[int, Any]:
        requester = await handlers.admin.get_admin_by_req(request)
        if txn_id is not None:
            check_identifier_text(txn_id, "txnId")
        body = parse_json_object_from_request(request)
        event_id = await handlers.server_notices.send(requester, body, txn_id)
        return 200, {"event_id": event_id}

    notice = admin_path("v1", "/send_server_notice")
    resource.register_paths("POST", notice, send_server_notice, "admin_send_server_notice")
    resource.register_paths(
        "PUT", notice + "/(?P<txn_id>[^/]+)", send_server_notice, "admin_send_server_notice"
    )

    async def scheduled_tasks(request: Request) -> tuple[int, Any]:
        await handlers.admin.get_admin_by_req(request)
        return 200, await handlers.admin.scheduled_tasks(
            query_string(request, "action_name"),
            query_string(request, "resource_id"),
            query_string(request, "status"),
            query_int(request, "max_timestamp"),
        )

    async def largest_rooms(request: Request) -> tuple[int, Any]:
        await handlers.admin.get_admin_by_req(request)
        return 200, await handlers.admin.largest_rooms()

    resource.register_paths(
        "GET", admin_path("v1", "/scheduled_tasks"), scheduled_tasks, "admin_scheduled_tasks"
    )
    resource.register_paths(
        "GET",
        admin_path("v1", "/statistics/database/rooms"),
        largest_rooms,
        "admin_database_room_stats",
    )
