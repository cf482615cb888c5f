"""The room directory (aliases, the public room list), the user directory, and
``GET /thirdparty/protocols`` and ``/protocol/{protocol}``, answered from
the application services' protocols (``appservice/queries.py``)."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import AuthError, Codes, SynapseError
from synapse_lite.api.identifiers import check_room_alias, check_room_id
from synapse_lite.handlers.directory import (
    MAX_SEARCH_TERM,
    PublicRoomsQuery,
    parse_public_rooms_body,
)
from synapse_lite.http.fields import get_optional_int, get_optional_str, get_str
from synapse_lite.http.server import (
    JsonResource,
    parse_json_object_from_request,
    query_int,
    query_string,
)
from synapse_lite.rest.client._base import client_path

if TYPE_CHECKING:
    from synapse_lite.rest.client import ClientHandlers


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    auth = handlers.auth
    directory = handlers.directory

    def alias_of(raw: str) -> str:
        # The path matcher has already decoded the segment ('#' is sent as %23).
        return check_room_alias(raw)

    async def put_alias(request: Request, room_alias: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        alias = alias_of(room_alias)
        body = parse_json_object_from_request(request)
        room_id = check_room_id(get_str(body, "room_id"))
        await directory.create_alias(requester, alias, room_id)
        return 200, {}

    async def get_alias(request: Request, room_alias: str) -> tuple[int, Any]:
        await auth.get_user_by_req(request)
        return 200, await directory.get_alias(alias_of(room_alias))

    async def delete_alias(request: Request, room_alias: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        await directory.delete_alias(requester, alias_of(room_alias))
        return 200, {}

    async def room_aliases(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        return 200, {"aliases": await directory.get_room_aliases(requester, room_id)}

    async def get_listing(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        return 200, {"visibility": await directory.get_visibility(requester, room_id)}

    async def put_listing(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        body = parse_json_object_from_request(request)
        await directory.set_visibility(requester, room_id, listing_visibility(body))
        return 200, {}

    def listing_visibility(body: dict[str, Any]) -> str:
        visibility = get_optional_str(body, "visibility") or "private"
        if visibility not in ("public", "private"):
            raise SynapseError(400, "'visibility' must be public or private", Codes.INVALID_PARAM)
        return visibility

    async def set_appservice_listing(
        request: Request, network_id: str, room_id: str, visibility: str
    ) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        if requester.app_service is None:
            raise AuthError(
                403,
                "Only an application service (with its as_token) may publish rooms"
                " in a network's room list",
            )
        check_room_id(room_id)
        await directory.set_appservice_visibility(
            requester.app_service, network_id, room_id, visibility
        )
        return 200, {}

    async def put_appservice_listing(
        request: Request, network_id: str, room_id: str
    ) -> tuple[int, Any]:
        body = parse_json_object_from_request(request)
        if "visibility" not in body:
            raise SynapseError(400, "'visibility' is required", Codes.MISSING_PARAM)
        return await set_appservice_listing(request, network_id, room_id, listing_visibility(body))

    async def delete_appservice_listing(
        request: Request, network_id: str, room_id: str
    ) -> tuple[int, Any]:
        # Not in the spec; the reference homeserver has it and SyTest uses it.
        return await set_appservice_listing(request, network_id, room_id, "private")

    async def get_public_rooms(request: Request) -> tuple[int, Any]:
        server = query_string(request, "server")
        # Our own list needs no access token (the spec's GET is public);
        # another server's does: an anonymous caller must not make us send
        # federation requests.
        if server is not None and server != handlers.server_name:
            await auth.get_user_by_req(request)
        query = PublicRoomsQuery(
            limit=query_int(request, "limit", None, maximum=1_000_000),
            since=query_string(request, "since"),
        )
        return 200, await directory.server_public_rooms(server, query)

    async def post_public_rooms(request: Request) -> tuple[int, Any]:
        await auth.get_user_by_req(request)
        body = parse_json_object_from_request(request, allow_empty=True)
        query = parse_public_rooms_body(body)
        return 200, await directory.server_public_rooms(query_string(request, "server"), query)

    async def search_users(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        body = parse_json_object_from_request(request)
        term = get_str(body, "search_term")
        if len(term) > MAX_SEARCH_TERM or "\x00" in term:
            raise SynapseError(400, "'search_term' is too long", Codes.INVALID_PARAM)
        limit = get_optional_int(body, "limit")
        return 200, await directory.search_users(requester, term, 10 if limit is None else limit)

    async def thirdparty_protocols(request: Request) -> tuple[int, Any]:
        await auth.get_user_by_req(request)
        return 200, await handlers.app_service_queries.protocols()

    async def thirdparty_protocol(request: Request, protocol: str) -> tuple[int, Any]:
        await auth.get_user_by_req(request)
        found = await handlers.app_service_queries.protocols(only=protocol)
        if protocol not in found:
            raise SynapseError(404, "No application service offers this protocol", Codes.NOT_FOUND)
        return 200, found[protocol]

    async def thirdparty_lookup(kind: str, request: Request, protocol: str) -> tuple[int, Any]:
        await auth.get_user_by_req(request)
        fields = {
            key.decode("utf-8", "replace"): [v.decode("utf-8", "replace") for v in values]
            for key, values in (request.args or {}).items()
            if key not in (b"access_token", b"user_id")
        }
        return 200, await handlers.app_service_queries.thirdparty_lookup(kind, protocol, fields)

    register = resource.register_paths
    alias_path = client_path("/directory/room/(?P<room_alias>[^/]+)")
    register("PUT", alias_path, put_alias, "directory_alias")
    register("GET", alias_path, get_alias, "directory_alias")
    register("DELETE", alias_path, delete_alias, "directory_alias")
    register("GET", client_path("/rooms/(?P<room_id>[^/]+)/aliases"), room_aliases, "room_aliases")
    listing = client_path("/directory/list/room/(?P<room_id>[^/]+)")
    register("GET", listing, get_listing, "directory_listing")
    register("PUT", listing, put_listing, "directory_listing")
    as_listing = client_path("/directory/list/appservice/(?P<network_id>[^/]+)/(?P<room_id>[^/]+)")
    register("PUT", as_listing, put_appservice_listing, "directory_appservice_listing")
    register("DELETE", as_listing, delete_appservice_listing, "directory_appservice_listing")
    register("GET", client_path("/publicRooms"), get_public_rooms, "public_rooms")
    register("POST", client_path("/publicRooms"), post_public_rooms, "public_rooms_search")
    register("POST", client_path("/user_directory/search"), search_users, "user_directory")
    register(
        "GET", client_path("/thirdparty/protocols"), thirdparty_protocols, "thirdparty_protocols"
    )
    register(
        "GET",
        client_path("/thirdparty/protocol/(?P<protocol>[^/]+)"),
        thirdparty_protocol,
        "thirdparty_protocols",
    )
    for kind in ("user", "location"):
        register(
            "GET",
            client_path(f"/thirdparty/{kind}/(?P<protocol>[^/]+)"),
            functools.partial(thirdparty_lookup, kind),
            "thirdparty_protocols",
        )
