"""Server-side search (``POST /search``); the logic is in ``handlers/search.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.http.server import JsonResource, parse_json_object_from_request, query_string
from synapse_lite.rest.client._base import client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    auth = handlers.auth

    async def search(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        next_batch = query_string(request, "next_batch")
        return 200, await handlers.search.search(requester, body, next_batch)

    resource.register_paths("POST", client_path("/search"), search, "search")
