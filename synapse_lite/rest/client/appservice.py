"""``POST /_matrix/client/v1/appservice/{appserviceId}/ping``: a service
checks that the homeserver can reach it (docs/appservices.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import AuthError
from synapse_lite.http.fields import get_optional_str
from synapse_lite.http.server import JsonResource, parse_json_object_from_request

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    async def ping(request: Request, appservice_id: str) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        service = requester.app_service
        if service is None or service.id != appservice_id:
            raise AuthError(403, "Only the application service itself may ping it")
        body = parse_json_object_from_request(request, allow_empty=True)
        transaction_id = get_optional_str(body, "transaction_id", max_length=255)
        return 200, await handlers.app_service_queries.ping(service, transaction_id)

    resource.register_paths(
        "POST",
        "/_matrix/client/v1/appservice/(?P<appservice_id>[^/]+)/ping",
        ping,
        "appservice_ping",
    )
