"""The deprecated r0 reads: ``GET /events``, ``GET /initialSync`` and
``GET /rooms/{roomId}/initialSync`` (``handlers/legacy_sync.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_room_id
from synapse_lite.http.server import JsonResource, query_int, query_string
from synapse_lite.rest.client._base import client_path
from synapse_lite.rest.client.room import ROOM

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

#: How long ``GET /events`` waits when the client names no ``timeout``.
DEFAULT_EVENTS_TIMEOUT_MS = 30_000


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    auth = handlers.auth

    async def events(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        room_id = query_string(request, "room_id")
        if room_id is not None:
            check_room_id(room_id)
        timeout = query_int(request, "timeout", DEFAULT_EVENTS_TIMEOUT_MS)
        assert timeout is not None
        return 200, await handlers.legacy_sync.get_events(
            requester,
            query_string(request, "from"),
            timeout,
            room_id,
            query_int(request, "limit"),
        )

    async def initial_sync(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        archived = query_string(request, "archived", "false")
        if archived not in ("true", "false"):
            raise SynapseError(400, "'archived' must be true or false", Codes.INVALID_PARAM)
        return 200, await handlers.legacy_sync.initial_sync(
            requester, query_int(request, "limit"), archived == "true"
        )

    async def room_initial_sync(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        return 200, await handlers.legacy_sync.room_initial_sync(
            requester, room_id, query_int(request, "limit")
        )

    register = resource.register_paths
    register("GET", client_path("/events"), events, "events")
    register("GET", client_path("/initialSync"), initial_sync, "initial_sync")
    register("GET", client_path(ROOM + "/initialSync"), room_initial_sync, "room_initial_sync")
