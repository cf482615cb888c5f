"""The admin API's registration tokens: ``GET /v1/registration_tokens``,
``POST /v1/registration_tokens/new`` and ``GET/PUT/DELETE
/v1/registration_tokens/{token}``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.http.server import JsonResource, parse_json_object_from_request, query_bool
from synapse_lite.rest.admin._base import admin_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

TOKENS = "/registration_tokens"
TOKEN = "/registration_tokens/(?P<token>[^/]+)"


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    admin = handlers.admin
    tokens = handlers.registration_tokens

    async def list_tokens(request: Request) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        valid = query_bool(request, "valid", None)
        return 200, {"registration_tokens": await tokens.list_tokens(valid)}

    async def create_token(request: Request) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request, allow_empty=True)
        return 200, await tokens.create_token(requester, body)

    async def get_token(request: Request, token: str) -> tuple[int, Any]:
        await admin.get_admin_by_req(request)
        return 200, await tokens.get_token(token)

    async def update_token(request: Request, token: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        body = parse_json_object_from_request(request, allow_empty=True)
        return 200, await tokens.update_token(requester, token, body)

    async def delete_token(request: Request, token: str) -> tuple[int, Any]:
        requester = await admin.get_admin_by_req(request)
        await tokens.delete_token(requester, token)
        return 200, {}

    register = resource.register_paths
    register("GET", admin_path("v1", TOKENS), list_tokens, "admin_registration_tokens")
    register(
        "POST", admin_path("v1", TOKENS + "/new"), create_token, "admin_registration_token_new"
    )
    register("GET", admin_path("v1", TOKEN), get_token, "admin_registration_token")
    register("PUT", admin_path("v1", TOKEN), update_token, "admin_registration_token")
    register("DELETE", admin_path("v1", TOKEN), delete_token, "admin_registration_token")
