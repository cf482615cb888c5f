"""``POST /user/{userId}/openid/request_token`` (the federation side,
``/openid/userinfo``, is in ``federation/server.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.identifiers import check_user_id
from synapse_lite.http.server import JsonResource, parse_json_object_from_request
from synapse_lite.rest.client._base import client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    async def request_token(request: Request, user_id: str) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        check_user_id(user_id, "userId")
        parse_json_object_from_request(request)  # the spec's body is an empty object
        return 200, await handlers.openid.request_token(requester, user_id)

    resource.register_paths(
        "POST",
        client_path("/user/(?P<user_id>[^/]+)/openid/request_token"),
        request_token,
        "openid_request_token",
    )
