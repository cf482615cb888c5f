"""Account management: the password, deactivation, and third-party
identifiers (3PIDs).

We validate no email addresses or phone numbers ourselves, so a user has no
3PIDs of this server's and adding one is refused with the spec's error
codes. Binding a 3PID at an identity server the client names, and unbinding
it, is done there (``handlers/identity.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import Codes, InteractiveAuthIncomplete, SynapseError
from synapse_lite.http.fields import get_str
from synapse_lite.http.server import JsonResource, parse_json_object_from_request
from synapse_lite.rest.client._base import client_path, unstable_client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers

_NOT_ADDED = "This server adds no third-party identifiers to accounts (it validates none)"


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    async def change_password(request: Request) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        try:
            await handlers.account.change_password(requester, body)
        except InteractiveAuthIncomplete as e:
            return 401, e.response
        return 200, {}

    async def deactivate(request: Request) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        try:
            return 200, await handlers.account.deactivate(requester, body)
        except InteractiveAuthIncomplete as e:
            return 401, e.response

    async def get_threepids(request: Request) -> tuple[int, Any]:
        await handlers.auth.get_user_by_req(request)
        return 200, {"threepids": []}

    async def add_threepid(request: Request) -> tuple[int, Any]:
        await handlers.auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        get_str(body, "client_secret", max_length=255)
        get_str(body, "sid", max_length=255)
        # No session id was ever handed out by us, so none can be validated.
        raise SynapseError(
            400,
            "No validation session: this server validates no email addresses or phone numbers",
            Codes.THREEPID_AUTH_FAILED,
        )

    async def post_threepids(request: Request) -> tuple[int, Any]:
        # The deprecated form of /3pid/add, with credentials from an identity server.
        await handlers.auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        if not isinstance(body.get("three_pid_creds"), dict):
            raise SynapseError(400, "'three_pid_creds' must be an object", Codes.BAD_JSON)
        raise SynapseError(403, _NOT_ADDED, Codes.THREEPID_AUTH_FAILED)

    async def bind_threepid(request: Request) -> tuple[int, Any]:
        requester = await handlers.auth.get_user_by_req(request)
        await handlers.identity.bind(requester, parse_json_object_from_request(request))
        return 200, {}

    async def remove_threepid(request: Request) -> tuple[int, Any]:
        # /3pid/delete and /3pid/unbind: the user has no 3PID of ours to
        # delete, so both unbind it at the identity servers it is bound at.
        requester = await handlers.auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        unbound = await handlers.identity.unbind(requester.user_id, body)
        return 200, {"id_server_unbind_result": unbound}

    def request_token(medium: str) -> Any:
        async def servlet(request: Request) -> tuple[int, Any]:
            body = parse_json_object_from_request(request)
            get_str(body, "client_secret", max_length=255)
            raise SynapseError(
                400,
                f"This server does not validate {medium} and cannot add them to accounts",
                Codes.THREEPID_MEDIUM_NOT_SUPPORTED,
            )

        return servlet

    resource.register_paths(
        "POST", client_path("/account/password"), change_password, "account_password"
    )
    resource.register_paths(
        "POST", client_path("/account/deactivate"), deactivate, "account_deactivate"
    )
    resource.register_paths("GET", client_path("/account/3pid"), get_threepids, "threepids")
    resource.register_paths("POST", client_path("/account/3pid"), post_threepids, "threepids")
    resource.register_paths("POST", client_path("/account/3pid/add"), add_threepid, "threepids")
    # Binding needs the main process (it signs requests to identity servers);
    # /bind and /unbind are also on the unstable paths of MSC2290's clients.
    for prefixed in (client_path, unstable_client_path):
        resource.register_paths(
            "POST", prefixed("/account/3pid/bind"), bind_threepid, "threepid_bindings"
        )
        resource.register_paths(
            "POST", prefixed("/account/3pid/unbind"), remove_threepid, "threepid_bindings"
        )
    resource.register_paths(
        "POST", client_path("/account/3pid/delete"), remove_threepid, "threepid_bindings"
    )
    for medium, what in (("email", "email addresses"), ("msisdn", "phone numbers")):
        resource.register_paths(
            "POST",
            client_path(f"/account/3pid/{medium}/requestToken"),
            request_token(what),
            "threepid_request_token",
        )
