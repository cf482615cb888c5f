"""Registering, logging in and out, whoami, and the admin API's shared-secret
registration (served with the client API)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, InteractiveAuthIncomplete, SynapseError
from synapse_lite.handlers.login import APP_SERVICE_LOGIN, LOGIN_FLOWS
from synapse_lite.http.server import JsonResource, parse_json_object_from_request, query_string
from synapse_lite.rest.client._base import client_ip, client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    async def register(request: Request) -> tuple[int, Any]:
        kind = query_string(request, "kind", "user")
        if kind not in ("user", "guest"):
            raise SynapseError(400, "'kind' must be user or guest", Codes.INVALID_PARAM)
        body = parse_json_object_from_request(request, allow_empty=kind == "guest")
        if body.get("type") == APP_SERVICE_LOGIN:
            service = handlers.auth.app_service_of(request)
            return 200, await handlers.registration.register_app_service_user(service, body)
        if kind == "guest":
            return 200, await handlers.registration.register_guest(client_ip(request), body)
        try:
            return 200, await handlers.registration.register(client_ip(request), body)
        except InteractiveAuthIncomplete as e:
            return 401, e.response

    async def register_available(request: Request) -> tuple[int, Any]:
        username = query_string(request, "username")
        if username is None:
            raise SynapseError(400, "Missing 'username'", Codes.MISSING_PARAM)
        await handlers.registration.check_username(username)
        return 200, {"available": True}

    async def token_validity(request: Request) -> tuple[int, Any]:
        token = query_string(request, "token")
        if token is None:
            raise SynapseError(400, "Missing 'token'", Codes.MISSING_PARAM)
        valid = await handlers.registration.token_validity(client_ip(request), token)
        return 200, {"valid": valid}

    async def get_login(request: Request) -> tuple[int, Any]:
        return 200, {"flows": LOGIN_FLOWS}

    async def login(request: Request) -> tuple[int, Any]:
        body = parse_json_object_from_request(request)
        service = None
        if body.get("type") == APP_SERVICE_LOGIN:
            service = handlers.auth.app_service_of(request)
        return 200, await handlers.login.login(client_ip(request), body, service)

    async def logout(request: Request) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        await handlers.login.logout(requester, all_devices=False)
        return 200, {}

    async def logout_all(request: Request) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        await handlers.login.logout(requester, all_devices=True)
        return 200, {}

    async def whoami(request: Request) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        answer: dict[str, Any] = {"user_id": requester.user_id, "is_guest": requester.is_guest}
        if requester.device_id:  # an application service may act without one
            answer["device_id"] = requester.device_id
        return 200, answer

    async def admin_nonce(request: Request) -> tuple[int, Any]:
        return 200, {"nonce": handlers.registration.new_nonce()}

    async def admin_register(request: Request) -> tuple[int, Any]:
        body = parse_json_object_from_request(request)
        handler = handlers.registration
        return 200, await handler.register_with_shared_secret(client_ip(request), body)

    resource.register_paths("POST", client_path("/register"), register, "register")
    resource.register_paths(
        "GET", client_path("/register/available"), register_available, "register_available"
    )
    resource.register_paths(
        "GET",
        "/_matrix/client/v1/register/m.login.registration_token/validity",
        token_validity,
        "registration_token_validity",
    )
    resource.register_paths("GET", client_path("/login"), get_login, "login")
    resource.register_paths("POST", client_path("/login"), login, "login")
    resource.register_paths("POST", client_path("/logout"), logout, "logout")
    resource.register_paths("POST", client_path("/logout/all"), logout_all, "logout_all")
    resource.register_paths("GET", client_path("/account/whoami"), whoami, "whoami")
    resource.register_paths("GET", "/_synapse/admin/v1/register", admin_nonce, "admin_register")
    resource.register_paths("POST", "/_synapse/admin/v1/register", admin_register, "admin_register")
