"""``GET /sync`` and sync filters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import AuthError, Codes, SynapseError
from synapse_lite.http.server import (
    JsonResource,
    parse_json_object_from_request,
    query_int,
    query_string,
)
from synapse_lite.rest.client._base import client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

PRESENCE_PARAMS = ("online", "offline", "unavailable")


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    auth = handlers.auth

    async def sync(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        timeout = query_int(request, "timeout", 0)
        full_state = query_string(request, "full_state", "false")
        if full_state not in ("true", "false"):
            raise SynapseError(400, "'full_state' must be true or false", Codes.INVALID_PARAM)
        set_presence = query_string(request, "set_presence", "online")
        if set_presence not in PRESENCE_PARAMS:
            raise SynapseError(400, "Unknown 'set_presence'", Codes.INVALID_PARAM)
        sync_filter = await handlers.filtering.get_sync_filter(
            requester.user_id, query_string(request, "filter")
        )
        assert timeout is not None and set_presence is not None
        return 200, await handlers.sync.sync(
            requester,
            query_string(request, "since"),
            timeout,
            full_state == "true",
            sync_filter,
            set_presence,
        )

    async def add_filter(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        if user_id != requester.user_id:
            raise AuthError(403, "Cannot create filters for other users")
        body = parse_json_object_from_request(request)
        filter_id = await handlers.filtering.add_filter(user_id, body)
        return 200, {"filter_id": str(filter_id)}

    async def get_filter(request: Request, user_id: str, filter_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        if user_id != requester.user_id:
            raise AuthError(403, "Cannot read other users' filters")
        return 200, await handlers.filtering.get_filter(user_id, filter_id)

    resource.register_paths("GET", client_path("/sync"), sync, "sync")
    user_filter = "/user/(?P<user_id>[^/]+)/filter"
    resource.register_paths("POST", client_path(user_filter), add_filter, "filter")
    resource.register_paths(
        "GET", client_path(user_filter + "/(?P<filter_id>[^/]+)"), get_filter, "filter"
    )
