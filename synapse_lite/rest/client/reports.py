"""Reporting content (rooms, events, users) and ``GET /admin/whois/{userId}``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.identifiers import check_identifier_text, check_room_id, check_user_id
from synapse_lite.http.server import JsonResource, parse_json_object_from_request
from synapse_lite.rest.client._base import client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    async def report_event(request: Request, room_id: str, event_id: str) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        check_room_id(room_id)
        check_identifier_text(event_id, "eventId")
        body = parse_json_object_from_request(request)
        await handlers.reports.report_event(requester, room_id, event_id, body)
        return 200, {}

    async def report_room(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        check_room_id(room_id)
        body = parse_json_object_from_request(request)
        await handlers.reports.report_room(requester, room_id, body)
        return 200, {}

    async def report_user(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        check_user_id(user_id, "userId")
        body = parse_json_object_from_request(request)
        await handlers.reports.report_user(requester, user_id, body)
        return 200, {}

    async def whois(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        check_user_id(user_id, "userId")
        return 200, await handlers.admin.whois(requester, user_id)

    room = "/rooms/(?P<room_id>[^/]+)/report"
    resource.register_paths(
        "POST", client_path(room + "/(?P<event_id>[^/]+)"), report_event, "report_event"
    )
    resource.register_paths("POST", client_path(room), report_room, "report_room")
    resource.register_paths(
        "POST", client_path("/users/(?P<user_id>[^/]+)/report"), report_user, "report_user"
    )
    resource.register_paths(
        "GET", client_path("/admin/whois/(?P<user_id>[^/]+)"), whois, "admin_whois"
    )
