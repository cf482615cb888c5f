"""``GET /_matrix/client/v1/rooms/{roomId}/hierarchy``: the rooms below a
space (``handlers/space_hierarchy.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.identifiers import check_room_id
from synapse_lite.http.server import JsonResource, query_bool, query_int, query_string

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    auth, spaces = handlers.auth, handlers.spaces

    async def hierarchy(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        return 200, await spaces.hierarchy(
            requester.user_id,
            check_room_id(room_id),
            limit=query_int(request, "limit", None, maximum=1_000_000),
            max_depth=query_int(request, "max_depth", None, maximum=1_000_000),
            suggested_only=bool(query_bool(request, "suggested_only", False)),
            from_token=query_string(request, "from"),
        )

    resource.register_paths(
        "GET",
        "/_matrix/client/v1/rooms/(?P<room_id>[^/]+)/hierarchy",
        hierarchy,
        "room_hierarchy",
    )
