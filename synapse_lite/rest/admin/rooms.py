"""The admin API's rooms: ``GET /v1/rooms``, ``/v1/rooms/{roomId}``,
``/members`` and ``/state``; deleting a room (``DELETE /v1/rooms/{roomId}``,
which waits for the job, and ``DELETE /v2/rooms/{roomId}``, which answers
its id) and the deletions' status."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.handlers.admin_rooms import ROOM_ORDERINGS
from synapse_lite.handlers.room_deletion import shutdown_json
from synapse_lite.http.fields import bool_value
from synapse_lite.http.server import (
    JsonResource,
    parse_json_object_from_request,
    query_bool,
    query_int,
    query_string,
)
from synapse_lite.rest.admin._base import (
    MAX_PAGE,
    admin_path,
    query_choice,
    query_descending,
)
from synapse_lite.rest.client.room import read_context, read_messages

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

ROOM = "/rooms/(?P<room_id>[^/]+)"


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    admin = handlers.admin
    rooms = handlers.admin_rooms

    async def list_rooms(request: Request) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        offset = query_int(request, "from", 0)
        limit = query_int(request, "limit", 100, minimum=1, maximum=MAX_PAGE)
        assert offset is not None and limit is not None
        return 200, await rooms.list_rooms(
            offset,
            limit,
            order_by=query_choice(request, "order_by", ROOM_ORDERINGS, "name"),
            descending=query_descending(request),
            search_term=query_string(request, "search_term"),
            public_rooms=query_bool(request, "public_rooms", None),
            empty_rooms=query_bool(request, "empty_rooms", None),
        )

    async def get_room(request: Request, room_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await rooms.get_room(room_id)

    async def get_members(request: Request, room_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await rooms.get_members(room_id)

    async def get_state(request: Request, room_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await rooms.get_state(room_id)

    deletion = handlers.room_deletion

    async def delete_room_v1(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request, allow_empty=True)
        task = await deletion.wait(await deletion.schedule(requester, room_id, body))
        return 200, shutdown_json(task)

    async def delete_room_v2(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request, allow_empty=True)
        return 200, {"delete_id": await deletion.schedule(requester, room_id, body)}

    async def room_delete_status(request: Request, room_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await deletion.status_of_room(room_id)

    async def delete_status(request: Request, delete_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await deletion.status_by_id(delete_id)

    resource.register_paths(
        "GET",
        admin_path("v2", "/rooms/delete_status/(?P<delete_id>[^/]+)"),
        delete_status,
        "admin_delete_status",
    )
    resource.register_paths(
        "GET", admin_path("v2", ROOM + "/delete_status"), room_delete_status, "admin_delete_status"
    )
    resource.register_paths("DELETE", admin_path("v1", ROOM), delete_room_v1, "admin_room")
    resource.register_paths("DELETE", admin_path("v2", ROOM), delete_room_v2, "admin_room")

    async def get_block(request: Request, room_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await rooms.get_block(room_id)

    async def put_block(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request)
        return 200, await rooms.set_block(
            requester, room_id, bool_value(body.get("block"), "block")
        )

    block = admin_path("v1", ROOM + "/block")
    resource.register_paths("GET", block, get_block, "admin_room_block")
    resource.register_paths("PUT", block, put_block, "admin_room_block")
    resource.register_paths("GET", admin_path("v1", "/rooms"), list_rooms, "admin_rooms")
    resource.register_paths("GET", admin_path("v1", ROOM), get_room, "admin_room")
    resource.register_paths(
        "GET", admin_path("v1", ROOM + "/members"), get_members, "admin_room_members"
    )
    resource.register_paths("GET", admin_path("v1", ROOM + "/state"), get_state, "admin_room_state")

    tools = handlers.admin_room_tools

    async def messages(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        page = await read_messages(
            handlers, requester, request, room_id, max_limit=MAX_PAGE, as_admin=True
        )
        return 200, page

    async def context(request: Request, room_id: str, event_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        return 200, await read_context(handlers, requester, request, room_id, event_id, True)

    async def make_room_admin(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request, allow_empty=True)
        if "user_id" in body and not isinstance(body["user_id"], str):
            raise SynapseError(400, "'user_id' must be a user id", Codes.INVALID_PARAM)
        await tools.make_room_admin(requester, room_id, body)
        return 200, {}

    async def forward_extremities(request: Request, room_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await tools.forward_extremities(room_id)

    async def delete_forward_extremities(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        return 200, await tools.delete_forward_extremities(requester, room_id)

    async def fetch_event(request: Request, event_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await tools.fetch_event(event_id)

    async def timestamp_to_event(request: Request, room_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        ts = query_int(request, "ts", None, minimum=0)
        if ts is None:
            raise SynapseError(400, "Missing query parameter 'ts'", Codes.MISSING_PARAM)
        forwards = query_choice(request, "dir", ("f", "b"), "f") == "f"
        return 200, await tools.timestamp_to_event(room_id, ts, forwards)

    spaces = handlers.spaces

    async def hierarchy(request: Request, room_id: str) -> tuple[int, Any]:
        # Every room of ours below the space, whoever may see it; nothing
        # asked of other servers (handlers/space_hierarchy.py).
        await admin.get_admin_by_req(request)
        return 200, await spaces.hierarchy(
            None,
            room_id,
            limit=query_int(request, "limit", None, maximum=1_000_000),
            max_depth=query_int(request, "max_depth", None, maximum=1_000_000),
            suggested_only=bool(query_bool(request, "suggested_only", False)),
            from_token=query_string(request, "from"),
        )

    purges = handlers.purge_history

    async def purge_history(
        request: Request, room_id: str, event_id: str | None = None
    ) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request, allow_empty=True)
        return 200, {"purge_id": await purges.schedule(requester, room_id, event_id, body)}

    async def purge_status(request: Request, purge_id: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await purges.status(purge_id)

    register = resource.register_paths
    purge = admin_path("v1", "/purge_history/(?P<room_id>[^/]+)")
    register("POST", purge, purge_history, "admin_purge_history")
    register("POST", purge + "/(?P<event_id>[^/]+)", purge_history, "admin_purge_history")
    register(
        "GET",
        admin_path("v1", "/purge_history_status/(?P<purge_id>[^/]+)"),
        purge_status,
        "admin_purge_history_status",
    )
    register("GET", admin_path("v1", ROOM + "/messages"), messages, "admin_room_messages")
    register(
        "GET",
        admin_path("v1", ROOM + "/context/(?P<event_id>[^/]+)"),
        context,
        "admin_room_context",
    )
    register(
        "POST",
        admin_path("v1", ROOM + "/make_room_admin"),
        make_room_admin,
        "admin_make_room_admin",
    )
    extremities = admin_path("v1", ROOM + "/forward_extremities")
    register("GET", extremities, forward_extremities, "admin_forward_extremities")
    register("DELETE", extremities, delete_forward_extremities, "admin_forward_extremities")
    register(
        "GET",
        admin_path("v1", "/fetch_event/(?P<event_id>[^/]+)"),
        fetch_event,
        "admin_fetch_event",
    )
    register("GET", admin_path("v1", ROOM + "/hierarchy"), hierarchy, "admin_room_hierarchy")
    register(
        "GET",
        admin_path("v1", ROOM + "/timestamp_to_event"),
        timestamp_to_event,
        "admin_timestamp_to_event",
    )
