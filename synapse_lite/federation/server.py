"""The federation and key APIs other servers call.

* ``keys``: ``GET /_matrix/key/v2/server`` (our self-signed key document)
  and the notary, ``GET``/``POST /_matrix/key/v2/query`` (no signature
  needed, as the spec says).
* ``/.well-known/matrix/server`` and ``/client`` (:func:`well_known_resource`),
  on listeners with ``client`` or ``federation``, when configured.
* ``federation``: ``PUT /_matrix/federation/v1/send/{txnId}``,
  ``GET /_matrix/federation/v1/version`` and
  ``GET /_matrix/federation/v1/openid/userinfo`` (answered for a valid OpenID
  token alone, as the spec says: the caller is any third party, not a server);
  our rooms (``handlers/federation_rooms.py``): ``GET /event``, ``/state``,
  ``/state_ids``, ``/event_auth``, ``/backfill``, ``POST
  /get_missing_events``, ``GET /make_join``, ``/make_leave``,
  ``/make_knock`` and ``PUT /v2/send_join``, ``/v2/send_leave``,
  ``/v1/send_knock``; ``GET``/``POST /publicRooms`` and
  ``GET /hierarchy/{roomId}`` (``handlers/space_hierarchy.py``); our users'
  devices and keys (``federation/user_keys.py``).

Every federation request must carry a valid ``X-Matrix`` signature of its
origin addressed to us; anything else is answered ``401 M_UNAUTHORIZED``,
logged, and has no effect.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from twisted.internet import defer
from twisted.web.server import Request

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_room_alias
from synapse_lite.federation.auth import AuthHeaderError, parse_auth_header, request_json
from synapse_lite.federation.crypto import (
    CanonicalJsonError,
    SignatureError,
    canonical_json,
    verify_signature,
)
from synapse_lite.federation.discovery import ServerNameError, parse_server_name
from synapse_lite.federation.keyring import KEY_PATH, QUERY_PATH, KeyLookupError
from synapse_lite.federation.user_keys import register_user_keys_servlets
from synapse_lite.handlers.directory import PublicRoomsQuery, parse_public_rooms_body
from synapse_lite.http.server import (
    JsonResource,
    parse_json_object_from_request,
    query_bool,
    query_int,
    query_string,
    query_strings,
)
from synapse_lite.metrics import FEDERATION_REQUESTS_REFUSED

if TYPE_CHECKING:
    from synapse_lite.config.federation import FederationConfig
    from synapse_lite.federation.inbound import FederationInboundHandler
    from synapse_lite.federation.keyring import Keyring
    from synapse_lite.handlers.directory import DirectoryHandler
    from synapse_lite.handlers.e2e_keys import E2eKeysHandler
    from synapse_lite.handlers.federation_join import FederationJoinHandler
    from synapse_lite.handlers.federation_rooms import FederationRoomsHandler
    from synapse_lite.handlers.openid import OpenIdHandler
    from synapse_lite.handlers.profile import ProfileHandler
    from synapse_lite.handlers.remote_devices import RemoteDeviceLists
    from synapse_lite.handlers.space_hierarchy import SpaceHierarchyHandler

logger = logging.getLogger(__name__)

FEDERATION_PREFIX = "/_matrix/federation/v1"
FEDERATION_V2_PREFIX = "/_matrix/federation/v2"
#: Transaction ids are opaque to us, but bounded.
_TXN_ID = r"(?P<txn_id>[^/]{1,255})"


class FederationAuthError(SynapseError):
    def __init__(self, msg: str) -> None:
        super().__init__(401, msg, Codes.UNAUTHORIZED)


async def authenticate_request(
    keyring: Keyring, server_name: str, request: Request, content: Any
) -> str:
    """The origin server of a signed request to us, or a 401 (logged); a
    400 ``M_UNAUTHORIZED`` when every Authorization header is malformed
    (not X-Matrix, an origin or destination that is no server name); a
    400 ``M_BAD_JSON`` for a body no server could have signed (not
    canonical JSON: a float, an integer out of range)."""
    try:
        canonical_json(content)
    except CanonicalJsonError as e:
        raise SynapseError(400, f"The body is not canonical JSON: {e}", Codes.BAD_JSON) from None
    headers = request.requestHeaders.getRawHeaders(b"Authorization") or []
    problems: list[str] = []
    malformed = 0
    for header in headers:
        try:
            auth = parse_auth_header(header)
            # Never look up the keys of (nor connect to) what is no server name.
            for name in (auth.origin, auth.destination):
                if name is not None:
                    parse_server_name(name)
        except (AuthHeaderError, ServerNameError) as e:
            problems.append(str(e))
            malformed += 1
            continue
        if auth.destination is not None and auth.destination != server_name:
            problems.append(f"addressed to {auth.destination!r}, not us")
            continue
        try:
            key = await keyring.get_verify_key(auth.origin, auth.key_id)
            uri = request.uri.decode("utf-8", "replace")
            message = canonical_json(
                request_json(request.method.decode("ascii"), uri, auth.origin, server_name, content)
            )
            verify_signature(message, auth.signature, key)
        except (KeyLookupError, SignatureError, ValueError) as e:
            problems.append(f"{auth.origin}: {e}")
            continue
        return auth.origin
    FEDERATION_REQUESTS_REFUSED.inc()
    reason = "; ".join(problems) or "no Authorization header"
    logger.warning(
        "Refused an unauthenticated federation request from %s to %s: %s",
        request.getClientAddress(),
        request.path.decode("ascii", "replace"),
        reason,
    )
    if headers and malformed == len(headers):
        # A header that is no X-Matrix one (an origin that is no server
        # name, say) is a malformed request, as the reference server says.
        raise SynapseError(
            400, f"Malformed X-Matrix Authorization header ({reason})", Codes.UNAUTHORIZED
        )
    raise FederationAuthError(f"Invalid or missing X-Matrix signature ({reason})")


WELL_KNOWN_SERVER_PATH = "/.well-known/matrix/server"
WELL_KNOWN_CLIENT_PATH = "/.well-known/matrix/client"


def well_known_resource(config: FederationConfig) -> JsonResource:
    """``/.well-known/matrix/server`` and ``/client`` as configured
    (``federation.well_known_server`` / ``well_known_client``). Each one not
    configured answers a JSON 404 with the CORS headers, as every answer
    does: a browser app (the admin UI) looks for ``/client`` before it logs
    in, and without them sees a failed request instead of a 404."""
    resource = JsonResource("well_known")

    async def on_server(request: Request) -> tuple[int, Any]:
        if config.well_known_server is None:
            raise SynapseError(404, "No server delegation here", Codes.NOT_FOUND)
        return 200, {"m.server": config.well_known_server}

    async def on_client(request: Request) -> tuple[int, Any]:
        if config.well_known_client is None:
            raise SynapseError(404, "No client discovery document here", Codes.NOT_FOUND)
        return 200, config.well_known_client

    resource.register_paths("GET", WELL_KNOWN_SERVER_PATH, on_server, "well_known.server")
    resource.register_paths("GET", WELL_KNOWN_CLIENT_PATH, on_client, "well_known.client")
    return resource


#: Servers one notary query may name.
MAX_NOTARY_SERVERS = 100


def _minimum_valid_until(value: str | None) -> int:
    if value is None:
        return 0
    if not value.isdigit() or len(value) > 16:
        raise SynapseError(
            400, "minimum_valid_until_ts must be a timestamp in milliseconds", Codes.INVALID_PARAM
        )
    return int(value)


def parse_notary_query(body: dict[str, Any]) -> dict[str, int]:
    """``server -> minimum_valid_until_ts`` of a ``POST /_matrix/key/v2/query``
    body (the latest any of its key ids asks for); 400 when malformed."""
    server_keys = body.get("server_keys")
    if not isinstance(server_keys, dict):
        raise SynapseError(400, "server_keys must be an object", Codes.BAD_JSON)
    if len(server_keys) > MAX_NOTARY_SERVERS:
        raise SynapseError(400, f"at most {MAX_NOTARY_SERVERS} servers per query", Codes.BAD_JSON)
    wanted: dict[str, int] = {}
    for server, criteria in server_keys.items():
        if not isinstance(criteria, dict):
            raise SynapseError(400, f"server_keys.{server} must be an object", Codes.BAD_JSON)
        minimum = 0
        for key_id, criterion in criteria.items():
            value = (
                criterion.get("minimum_valid_until_ts", 0) if isinstance(criterion, dict) else None
            )
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise SynapseError(
                    400,
                    f"server_keys.{server}.{key_id} must be an object with an integer"
                    " minimum_valid_until_ts",
                    Codes.BAD_JSON,
                )
            minimum = max(minimum, value)
        wanted[server] = minimum
    return wanted


def register_query_servlets(
    resource: JsonResource,
    keyring: Keyring,
    server_name: str,
    profiles: ProfileHandler,
    directory: DirectoryHandler,
) -> None:
    """``GET /query/profile`` and ``/query/directory``: other servers asking
    about our users and aliases (signed; 400 for another server's, 404 for
    one we do not have); ``GET``/``POST /publicRooms``: our room directory."""

    async def on_profile(request: Request) -> tuple[int, Any]:
        await authenticate_request(keyring, server_name, request, None)
        user_id = query_string(request, "user_id")
        field = query_string(request, "field")
        if user_id is None:
            raise SynapseError(400, "user_id is required", Codes.MISSING_PARAM)
        if field is not None and field not in ("displayname", "avatar_url"):
            raise SynapseError(400, "field must be displayname or avatar_url", Codes.INVALID_PARAM)
        if not user_id.startswith("@") or user_id.split(":", 1)[-1] != server_name:
            raise SynapseError(
                400, f"{user_id} is not a user of {server_name}", Codes.INVALID_PARAM
            )
        profile = await profiles.get_profile(user_id)
        wanted = (field,) if field else ("displayname", "avatar_url")
        return 200, {k: profile[k] for k in wanted if profile.get(k) is not None}

    async def on_directory(request: Request) -> tuple[int, Any]:
        await authenticate_request(keyring, server_name, request, None)
        alias = query_string(request, "room_alias")
        if alias is None:
            raise SynapseError(400, "room_alias is required", Codes.MISSING_PARAM)
        check_room_alias(alias, server_name)
        return 200, await directory.get_alias(alias)

    async def on_get_public_rooms(request: Request) -> tuple[int, Any]:
        await authenticate_request(keyring, server_name, request, None)
        query = PublicRoomsQuery(
            limit=query_int(request, "limit", None, maximum=1_000_000),
            since=query_string(request, "since"),
            instance_id=query_string(request, "third_party_instance_id"),
            all_networks=bool(query_bool(request, "include_all_networks", False)),
        )
        return 200, await directory.public_rooms(query)

    async def on_post_public_rooms(request: Request) -> tuple[int, Any]:
        body = parse_json_object_from_request(request, allow_empty=True)
        await authenticate_request(keyring, server_name, request, body)
        return 200, await directory.public_rooms(parse_public_rooms_body(body))

    public_rooms = f"{FEDERATION_PREFIX}/publicRooms"
    resource.register_paths("GET", public_rooms, on_get_public_rooms, "federation.public_rooms")
    resource.register_paths("POST", public_rooms, on_post_public_rooms, "federation.public_rooms")
    resource.register_paths(
        "GET", f"{FEDERATION_PREFIX}/query/profile", on_profile, "federation.query_profile"
    )
    resource.register_paths(
        "GET", f"{FEDERATION_PREFIX}/query/directory", on_directory, "federation.query_directory"
    )


def register_federation_servlets(
    resource: JsonResource,
    resources: tuple[str, ...],
    *,
    keyring: Keyring,
    inbound: FederationInboundHandler,
    server_name: str,
    openid: OpenIdHandler | None = None,
    rooms: FederationRoomsHandler | None = None,
    profiles: ProfileHandler | None = None,
    directory: DirectoryHandler | None = None,
    invites: FederationJoinHandler | None = None,
    user_keys: tuple[RemoteDeviceLists, E2eKeysHandler] | None = None,
    spaces: SpaceHierarchyHandler | None = None,
) -> None:
    """Serve the ``federation`` and/or ``keys`` APIs on ``resource``
    (``rooms``: our rooms served to other servers; ``invites``: other
    servers inviting our users; ``user_keys``: our users' devices and keys,
    ``federation/user_keys.py``; ``spaces``: our spaces' hierarchies)."""
    if "keys" in resources:

        async def on_get_key(request: Request, key_id: str | None = None) -> tuple[int, Any]:
            return 200, keyring.local_key_document()

        resource.register_paths("GET", KEY_PATH, on_get_key, "keys")
        resource.register_paths("GET", KEY_PATH + r"/(?P<key_id>[^/]+)", on_get_key, "keys")

        async def on_query_one(
            request: Request, server: str, key_id: str | None = None
        ) -> tuple[int, Any]:
            minimum = _minimum_valid_until(query_string(request, "minimum_valid_until_ts"))
            return 200, {"server_keys": await keyring.notary_documents(server, minimum)}

        async def on_query(request: Request) -> tuple[int, Any]:
            wanted = parse_notary_query(parse_json_object_from_request(request))
            # Fetched at once: one slow server must not hold up the others.
            answers = await defer.gatherResults(
                [
                    defer.ensureDeferred(keyring.notary_documents(server, minimum))
                    for server, minimum in wanted.items()
                ],
                consumeErrors=True,
            )
            return 200, {"server_keys": [d for documents in answers for d in documents]}

        server_part = r"/(?P<server>[^/]{1,255})"
        resource.register_paths("POST", QUERY_PATH, on_query, "keys.query")
        resource.register_paths("GET", QUERY_PATH + server_part, on_query_one, "keys.query")
        resource.register_paths(
            "GET", QUERY_PATH + server_part + r"/(?P<key_id>[^/]+)", on_query_one, "keys.query"
        )

    if "federation" in resources:

        async def on_send(request: Request, txn_id: str) -> tuple[int, Any]:
            body = parse_json_object_from_request(request)
            origin = await authenticate_request(keyring, server_name, request, body)
            return 200, await inbound.on_transaction(origin, txn_id, body)

        async def on_version(request: Request) -> tuple[int, Any]:
            return 200, {"server": {"name": "synapse_lite", "version": "0.1.0"}}

        resource.register_paths(
            "PUT", f"{FEDERATION_PREFIX}/send/{_TXN_ID}", on_send, "federation.send"
        )
        resource.register_paths(
            "GET", f"{FEDERATION_PREFIX}/version", on_version, "federation.version"
        )

    if "federation" in resources and profiles is not None and directory is not None:
        register_query_servlets(resource, keyring, server_name, profiles, directory)

    if "federation" in resources and openid is not None:
        openid_handler = openid

        async def on_openid_userinfo(request: Request) -> tuple[int, Any]:
            # Called by any third party with the token alone: no X-Matrix.
            return 200, await openid_handler.userinfo(query_string(request, "access_token"))

        resource.register_paths(
            "GET",
            f"{FEDERATION_PREFIX}/openid/userinfo",
            on_openid_userinfo,
            "federation.openid_userinfo",
        )

    if "federation" in resources and rooms is not None:
        _register_room_servlets(resource, keyring, server_name, rooms)

    if "federation" in resources and invites is not None:
        _register_invite_servlets(resource, keyring, server_name, invites)

    if "federation" in resources and user_keys is not None:
        register_user_keys_servlets(
            resource,
            lambda request, body: authenticate_request(keyring, server_name, request, body),
            server_name,
            *user_keys,
        )

    if "federation" in resources and spaces is not None:
        space_handler = spaces

        async def on_hierarchy(request: Request, room_id: str) -> tuple[int, Any]:
            origin = await authenticate_request(keyring, server_name, request, None)
            suggested_only = bool(query_bool(request, "suggested_only", False))
            return 200, await space_handler.on_federation_hierarchy(origin, room_id, suggested_only)

        resource.register_paths(
            "GET",
            f"{FEDERATION_PREFIX}/hierarchy/(?P<room_id>[^/]+)",
            on_hierarchy,
            "federation.hierarchy",
        )


def _register_room_servlets(
    resource: JsonResource, keyring: Keyring, server_name: str, rooms: FederationRoomsHandler
) -> None:
    """The room endpoints (handlers/federation_rooms.py): reading our rooms
    and joining them."""
    room = r"(?P<room_id>[^/]+)"
    event = r"(?P<event_id>[^/]+)"

    async def origin_of(request: Request, content: Any = None) -> str:
        return await authenticate_request(keyring, server_name, request, content)

    async def on_event(request: Request, event_id: str) -> tuple[int, Any]:
        return 200, await rooms.on_event(await origin_of(request), event_id)

    def at_event(request: Request) -> str:
        event_id = query_string(request, "event_id")
        if not event_id:
            raise SynapseError(400, "'event_id' is required", Codes.MISSING_PARAM)
        return event_id

    async def on_state(request: Request, room_id: str) -> tuple[int, Any]:
        origin = await origin_of(request)
        return 200, await rooms.on_state(origin, room_id, at_event(request))

    async def on_state_ids(request: Request, room_id: str) -> tuple[int, Any]:
        origin = await origin_of(request)
        return 200, await rooms.on_state_ids(origin, room_id, at_event(request))

    async def on_event_auth(request: Request, room_id: str, event_id: str) -> tuple[int, Any]:
        return 200, await rooms.on_event_auth(await origin_of(request), room_id, event_id)

    async def on_backfill(request: Request, room_id: str) -> tuple[int, Any]:
        origin = await origin_of(request)
        limit = query_int(request, "limit")
        return 200, await rooms.on_backfill(origin, room_id, query_strings(request, "v"), limit)

    async def on_get_missing_events(request: Request, room_id: str) -> tuple[int, Any]:
        body = parse_json_object_from_request(request)
        origin = await origin_of(request, body)
        return 200, await rooms.on_get_missing_events(origin, room_id, body)

    async def on_make_join(request: Request, room_id: str, user_id: str) -> tuple[int, Any]:
        origin = await origin_of(request)
        versions = query_strings(request, "ver")
        return 200, await rooms.on_make_join(origin, room_id, user_id, versions)

    async def on_send_join(request: Request, room_id: str, event_id: str) -> tuple[int, Any]:
        body = parse_json_object_from_request(request)
        origin = await origin_of(request, body)
        return 200, await rooms.on_send_join(origin, room_id, event_id, body)

    async def on_send_join_v1(request: Request, room_id: str, event_id: str) -> tuple[int, Any]:
        # v1 (deprecated, still used by some servers and SyTest): the same
        # answer in a [200, {...}] list.
        return 200, [200, (await on_send_join(request, room_id, event_id))[1]]

    async def on_make_leave(request: Request, room_id: str, user_id: str) -> tuple[int, Any]:
        return 200, await rooms.on_make_leave(await origin_of(request), room_id, user_id)

    async def on_send_leave(request: Request, room_id: str, event_id: str) -> tuple[int, Any]:
        body = parse_json_object_from_request(request)
        origin = await origin_of(request, body)
        return 200, await rooms.on_send_leave(origin, room_id, event_id, body)

    async def on_send_leave_v1(request: Request, room_id: str, event_id: str) -> tuple[int, Any]:
        return 200, [200, (await on_send_leave(request, room_id, event_id))[1]]

    async def on_make_knock(request: Request, room_id: str, user_id: str) -> tuple[int, Any]:
        origin = await origin_of(request)
        versions = query_strings(request, "ver")
        return 200, await rooms.on_make_knock(origin, room_id, user_id, versions)

    async def on_send_knock(request: Request, room_id: str, event_id: str) -> tuple[int, Any]:
        body = parse_json_object_from_request(request)
        origin = await origin_of(request, body)
        return 200, await rooms.on_send_knock(origin, room_id, event_id, body)

    v1, v2 = FEDERATION_PREFIX, FEDERATION_V2_PREFIX
    for method, path, callback, name in (
        ("GET", f"{v1}/event/{event}", on_event, "event"),
        ("GET", f"{v1}/state/{room}", on_state, "state"),
        ("GET", f"{v1}/state_ids/{room}", on_state_ids, "state_ids"),
        ("GET", f"{v1}/event_auth/{room}/{event}", on_event_auth, "event_auth"),
        ("GET", f"{v1}/backfill/{room}", on_backfill, "backfill"),
        ("POST", f"{v1}/get_missing_events/{room}", on_get_missing_events, "get_missing_events"),
        ("GET", f"{v1}/make_join/{room}/(?P<user_id>[^/]+)", on_make_join, "make_join"),
        ("PUT", f"{v2}/send_join/{room}/{event}", on_send_join, "send_join"),
        ("PUT", f"{v1}/send_join/{room}/{event}", on_send_join_v1, "send_join_v1"),
        ("GET", f"{v1}/make_leave/{room}/(?P<user_id>[^/]+)", on_make_leave, "make_leave"),
        ("PUT", f"{v2}/send_leave/{room}/{event}", on_send_leave, "send_leave"),
        ("PUT", f"{v1}/send_leave/{room}/{event}", on_send_leave_v1, "send_leave_v1"),
        ("GET", f"{v1}/make_knock/{room}/(?P<user_id>[^/]+)", on_make_knock, "make_knock"),
        ("PUT", f"{v1}/send_knock/{room}/{event}", on_send_knock, "send_knock"),
    ):
        resource.register_paths(method, path, callback, f"federation.{name}")


def _register_invite_servlets(
    resource: JsonResource, keyring: Keyring, server_name: str, invites: FederationJoinHandler
) -> None:
    """``PUT /v1/invite`` and ``/v2/invite``: another server invites one of
    our users (``handlers/federation_join.py``); v1 answers ``[200, {event}]``."""
    path = r"/invite/(?P<room_id>[^/]+)/(?P<event_id>[^/]+)"

    def servlet(v2: bool) -> Any:
        async def on_invite(request: Request, room_id: str, event_id: str) -> tuple[int, Any]:
            body = parse_json_object_from_request(request)
            origin = await authenticate_request(keyring, server_name, request, body)
            answer = await invites.on_invite(origin, room_id, event_id, body, v2)
            return 200, (answer if v2 else [200, answer])

        return on_invite

    resource.register_paths("PUT", FEDERATION_PREFIX + path, servlet(False), "federation.invite_v1")
    resource.register_paths("PUT", FEDERATION_V2_PREFIX + path, servlet(True), "federation.invite")
