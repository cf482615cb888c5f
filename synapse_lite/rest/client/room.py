"""Rooms: create, membership, send, state, messages, members, typing, receipts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from twisted.web.server import Request

from synapse_lite.api.errors import THIRD_PARTY_INVITES_REFUSED, AuthError, Codes, SynapseError
from synapse_lite.api.identifiers import (
    check_identifier_text,
    check_room_id,
    check_user_id,
)
from synapse_lite.handlers.filtering import parse_room_event_filter
from synapse_lite.handlers.shadow_ban import fake_event_id
from synapse_lite.handlers.suspension import refuse_if_suspended
from synapse_lite.handlers.typing import check_typing_request
from synapse_lite.http.fields import get_optional_str
from synapse_lite.http.server import (
    JsonResource,
    parse_json_object_from_request,
    query_int,
    query_string,
    query_strings,
)
from synapse_lite.rest.client._base import client_path

if TYPE_CHECKING:
    from synapse_lite.handlers.auth import Requester
    from synapse_lite.rest.client import ClientHandlers

ROOM = "/rooms/(?P<room_id>[^/]+)"
MEMBERSHIPS = ("join", "invite", "leave", "ban", "knock")
#: The most events ``/context`` returns around its event.
MAX_CONTEXT_LIMIT = 1000


def service_timestamp(request: Request, requester: Requester) -> int | None:
    """An application service's ``?ts=`` (timestamp massaging, on sends and
    state), or None; ignored from anyone else, as the spec reserves it to
    services. 400 ``M_INVALID_PARAM`` for a value no event could carry."""
    raw = query_string(request, "ts")
    if raw is None or requester.app_service is None:
        return None
    if not raw.isdigit() or int(raw) >= 2**53:
        raise SynapseError(400, "'ts' must be a time in ms since the epoch", Codes.INVALID_PARAM)
    return int(raw)


def register_servlets(handlers: ClientHandlers, resource: JsonResource) -> None:
    auth = handlers.auth

    async def create_room(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        refuse_if_suspended(requester, "create rooms")
        body = parse_json_object_from_request(request, allow_empty=True)
        if requester.shadow_banned:
            # The room is made; its invites reach nobody.
            body = {k: v for k, v in body.items() if k not in ("invite", "invite_3pid")}
        room_id = await handlers.room_creation.create_room(requester, body)
        return 200, {"room_id": room_id}

    async def room_of(room_id_or_alias: str) -> str:
        """The room an id or an alias names (404 for an unknown alias)."""
        if room_id_or_alias.startswith("#"):
            return await handlers.directory.resolve_alias(room_id_or_alias)
        return check_room_id(room_id_or_alias)

    async def room_and_servers(request: Request, room_id: str) -> tuple[str, list[str]]:
        """The room an id or alias names and the servers to join or knock on
        a room of other servers through: the request's (``server_name``,
        ``via`` from v1.12), then a remote alias's."""
        servers = [*query_strings(request, "via"), *query_strings(request, "server_name")]
        if room_id.startswith("#") and not room_id.endswith(":" + handlers.server_name):
            found = await handlers.directory.get_alias(room_id)
            return found["room_id"], servers + found["servers"]
        return await room_of(room_id), servers

    async def join(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        refuse_if_suspended(requester, "join rooms")
        room_id, servers = await room_and_servers(request, room_id)
        body = parse_json_object_from_request(request, allow_empty=True)
        reason = get_optional_str(body, "reason", max_length=1024)
        await handlers.members.update_membership(
            requester, room_id, "join", reason=reason, join_content=body, servers=servers
        )
        return 200, {"room_id": room_id}

    async def knock(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        refuse_if_suspended(requester, "knock on rooms")
        room_id, servers = await room_and_servers(request, room_id)
        body = parse_json_object_from_request(request, allow_empty=True)
        reason = get_optional_str(body, "reason", max_length=1024)
        await handlers.members.update_membership(
            requester, room_id, "knock", reason=reason, servers=servers
        )
        return 200, {"room_id": room_id}

    async def upgrade(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        refuse_if_suspended(requester, "upgrade rooms")
        check_room_id(room_id)
        body = parse_json_object_from_request(request)
        if "new_version" not in body:
            raise SynapseError(400, "Missing 'new_version'", Codes.MISSING_PARAM)
        new_room = await handlers.room_upgrade.upgrade_room(
            requester, room_id, body["new_version"], body.get("additional_creators")
        )
        return 200, {"replacement_room": new_room}

    def membership_servlet(action: str) -> Any:
        async def servlet(request: Request, room_id: str) -> tuple[int, Any]:
            requester = await auth.get_user_by_req(request)
            if action == "invite":
                refuse_if_suspended(requester, "invite")
            check_room_id(room_id)
            body = parse_json_object_from_request(request, allow_empty=True)
            if action == "invite" and "user_id" not in body and "medium" in body:
                # The spec's third-party invite (by email through an identity
                # server): not built (docs/client-api.md).
                raise SynapseError(
                    400,
                    THIRD_PARTY_INVITES_REFUSED + ": invite by Matrix user id",
                    Codes.SERVER_NOT_TRUSTED,
                )
            target = None if action == "leave" else check_user_id(body.get("user_id"))
            reason = get_optional_str(body, "reason", max_length=1024)
            if action == "invite" and requester.shadow_banned:
                return 200, {}
            await handlers.members.update_membership(requester, room_id, action, target, reason)
            return 200, {}

        return servlet

    async def send(request: Request, room_id: str, event_type: str, txn_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        check_identifier_text(event_type, "eventType")
        check_identifier_text(txn_id, "txnId")
        if event_type == "m.room.redaction":
            raise SynapseError(
                400, "Send redactions with /rooms/{roomId}/redact", Codes.INVALID_PARAM
            )
        content = parse_json_object_from_request(request)
        refuse_if_suspended(requester, "send events")
        if requester.shadow_banned:
            return 200, {"event_id": fake_event_id(requester, room_id, txn_id)}
        event_id = await handlers.events.send_client_event(
            requester,
            room_id,
            event_type,
            content,
            txn_id=txn_id,
            origin_server_ts=service_timestamp(request, requester),
        )
        return 200, {"event_id": event_id}

    async def send_without_txn(request: Request, room_id: str, event_type: str) -> tuple[int, Any]:
        """``POST .../send/{eventType}`` (r0, dropped from the spec since):
        a send with no transaction id, so not idempotent."""
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        check_identifier_text(event_type, "eventType")
        content = parse_json_object_from_request(request)
        refuse_if_suspended(requester, "send events")
        if requester.shadow_banned:
            return 200, {"event_id": fake_event_id(requester, room_id, None)}
        event_id = await handlers.events.send_client_event(requester, room_id, event_type, content)
        return 200, {"event_id": event_id}

    async def redact(
        request: Request, room_id: str, event_id: str, txn_id: str | None = None
    ) -> tuple[int, Any]:
        """``PUT .../redact/{eventId}/{txnId}``, and r0's ``POST
        .../redact/{eventId}`` (no transaction id: not idempotent; dropped
        from the spec since, as ``POST .../send/{eventType}``)."""
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        check_identifier_text(event_id, "eventId")
        if txn_id is not None:
            check_identifier_text(txn_id, "txnId")
        body = parse_json_object_from_request(request, allow_empty=True)
        reason = get_optional_str(body, "reason", max_length=1024)
        content: dict[str, object] = {} if reason is None else {"reason": reason}
        if requester.suspended:
            # Their own events they may still redact.
            target = await handlers.pagination.get_event(requester, room_id, event_id)
            if target.sender != requester.user_id:
                refuse_if_suspended(requester, "redact others' events")
        if requester.shadow_banned:
            txn_key = None if txn_id is None else f"redact {event_id} {txn_id}"
            return 200, {"event_id": fake_event_id(requester, room_id, txn_key)}
        redaction_id = await handlers.events.send_client_event(
            requester, room_id, "m.room.redaction", content, txn_id=txn_id, redacts=event_id
        )
        return 200, {"event_id": redaction_id}

    async def put_state(
        request: Request, room_id: str, event_type: str, state_key: str = ""
    ) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        check_identifier_text(event_type, "eventType")
        check_identifier_text(state_key, "stateKey")
        content = parse_json_object_from_request(request)
        if event_type != "m.room.member" or content.get("membership") != "leave":
            refuse_if_suspended(requester, "send events")
        if event_type == "m.room.canonical_alias" and state_key == "":
            await handlers.directory.check_canonical_alias(room_id, content)
        if requester.shadow_banned and (
            event_type != "m.room.member" or content.get("membership") == "invite"
        ):
            # No transaction id: a repeat gets another id, as a real
            # state change's would when it changes the state again.
            return 200, {"event_id": fake_event_id(requester, room_id, None)}
        event_id = await handlers.events.send_client_event(
            requester,
            room_id,
            event_type,
            content,
            state_key=state_key,
            origin_server_ts=service_timestamp(request, requester),
        )
        return 200, {"event_id": event_id}

    async def get_state_event(
        request: Request, room_id: str, event_type: str, state_key: str = ""
    ) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        answer_format = query_string(request, "format", "content")
        if answer_format not in ("content", "event"):
            raise SynapseError(400, "'format' must be content or event", Codes.INVALID_PARAM)
        event = await handlers.pagination.get_state_event(requester, room_id, event_type, state_key)
        if answer_format == "event":
            return 200, event.to_client_dict(handlers.clock.time_msec())
        return 200, event.content

    async def get_state(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        now_ms = handlers.clock.time_msec()
        events = await handlers.pagination.get_state(requester, room_id)
        return 200, [e.to_client_dict(now_ms) for e in events]

    async def messages(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        return 200, await read_messages(handlers, requester, request, room_id, max_limit=10_000)

    async def get_event(request: Request, room_id: str, event_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        check_identifier_text(event_id, "eventId")
        event = await handlers.pagination.get_event(requester, room_id, event_id)
        visibility = await handlers.pagination.room_visibility(requester, room_id)
        [served] = await handlers.relations.serve([event], requester.user_id, visibility)
        return 200, served

    async def context(request: Request, room_id: str, event_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        return 200, await read_context(handlers, requester, request, room_id, event_id)

    async def forget(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        parse_json_object_from_request(request, allow_empty=True)
        await handlers.members.forget(requester.user_id, room_id)
        return 200, {}

    async def members(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        membership = query_string(request, "membership")
        not_membership = query_string(request, "not_membership")
        for value in (membership, not_membership):
            if value is not None and value not in MEMBERSHIPS:
                raise SynapseError(400, "Unknown membership", Codes.INVALID_PARAM)
        now_ms = handlers.clock.time_msec()
        events = await handlers.pagination.get_members(
            requester, room_id, membership, not_membership
        )
        return 200, {"chunk": [e.to_client_dict(now_ms) for e in events]}

    async def joined_members(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        events = await handlers.pagination.get_members(requester, room_id, "join", None)
        joined: dict[str, dict[str, str | None]] = {}
        for event in events:
            # Both keys always, null when unset: clients (and SyTest) read
            # them as the reference server gives them. The spec's schema
            # types them as strings, with no word on unset ones.
            assert event.state_key is not None
            joined[event.state_key] = {
                key: value if isinstance(value, str) else None
                for key, value in (
                    ("display_name", event.content.get("displayname")),
                    ("avatar_url", event.content.get("avatar_url")),
                )
            }
        return 200, {"joined": joined}

    async def joined_rooms(request: Request) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        rooms = await handlers.members.joined_rooms(requester.user_id)
        return 200, {"joined_rooms": sorted(rooms)}

    async def typing(request: Request, room_id: str, user_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        if user_id != requester.user_id:
            raise AuthError(403, "Cannot set another user's typing state")
        is_typing, timeout = check_typing_request(parse_json_object_from_request(request))
        if requester.shadow_banned:
            return 200, {}
        await handlers.typing.set_typing(requester.user_id, user_id, room_id, is_typing, timeout)
        return 200, {}

    async def receipt(
        request: Request, room_id: str, receipt_type: str, event_id: str
    ) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        check_identifier_text(event_id, "eventId")
        body = parse_json_object_from_request(request, allow_empty=True)
        thread_id = get_optional_str(body, "thread_id", max_length=255)
        if receipt_type == "m.fully_read":
            await read_marker(requester, room_id, event_id)
        else:
            await handlers.receipts.send_receipt(
                requester, room_id, receipt_type, event_id, thread_id
            )
        return 200, {}

    async def read_marker(requester: Any, room_id: str, event_id: str) -> None:
        await handlers.members.check_joined(requester.user_id, room_id)
        await handlers.account_data.set_account_data(
            requester.user_id, room_id, "m.fully_read", {"event_id": event_id}
        )

    async def read_markers(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        body = parse_json_object_from_request(request)
        # Checked up front: a body with no marker in it would otherwise get a
        # 200 from a room the user is not in.
        await handlers.members.check_joined(requester.user_id, room_id)
        for key in ("m.fully_read", "m.read", "m.read.private"):
            event_id = get_optional_str(body, key, max_length=255)
            if event_id is None:
                continue
            if key == "m.fully_read":
                await read_marker(requester, room_id, event_id)
            else:
                await handlers.receipts.send_receipt(requester, room_id, key, event_id, None)
        return 200, {}

    async def relations(
        request: Request,
        room_id: str,
        event_id: str,
        rel_type: str | None = None,
        event_type: str | None = None,
    ) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        check_identifier_text(event_id, "eventId")
        for value, what in ((rel_type, "relType"), (event_type, "eventType")):
            if value is not None:
                check_identifier_text(value, what)
        direction = query_string(request, "dir", "b")
        if direction not in ("b", "f"):
            raise SynapseError(400, "'dir' must be b or f", Codes.INVALID_PARAM)
        recurse = query_string(request, "recurse", "false")
        if recurse not in ("true", "false"):
            raise SynapseError(400, "'recurse' must be true or false", Codes.INVALID_PARAM)
        limit = query_int(request, "limit", 50, maximum=10_000)
        assert limit is not None
        return 200, await handlers.relations.get_relations(
            requester,
            room_id,
            event_id,
            rel_type,
            event_type,
            query_string(request, "from"),
            query_string(request, "to"),
            limit,
            direction,
            recurse == "true",
        )

    async def threads(request: Request, room_id: str) -> tuple[int, Any]:
        requester = await auth.get_user_by_req(request)
        check_room_id(room_id)
        include = query_string(request, "include", "all")
        if include not in ("all", "participated"):
            raise SynapseError(400, "'include' must be all or participated", Codes.INVALID_PARAM)
        limit = query_int(request, "limit", 50, maximum=10_000)
        assert limit is not None
        return 200, await handlers.relations.get_threads(
            requester, room_id, include, query_string(request, "from"), limit
        )

    register = resource.register_paths
    v1_room = "/_matrix/client/v1/rooms/(?P<room_id>[^/]+)"
    relations_path = v1_room + "/relations/(?P<event_id>[^/]+)"
    register("GET", relations_path, relations, "relations")
    register("GET", relations_path + "/(?P<rel_type>[^/]+)", relations, "relations")
    register(
        "GET",
        relations_path + "/(?P<rel_type>[^/]+)/(?P<event_type>[^/]+)",
        relations,
        "relations",
    )
    register("GET", v1_room + "/threads", threads, "threads")
    register("POST", client_path("/createRoom"), create_room, "create_room")
    register("POST", client_path("/join/(?P<room_id>[^/]+)"), join, "join")
    register("POST", client_path(ROOM + "/join"), join, "join")
    register("POST", client_path("/knock/(?P<room_id>[^/]+)"), knock, "knock")
    register("POST", client_path(ROOM + "/upgrade"), upgrade, "upgrade")
    for action in ("invite", "leave", "kick", "ban", "unban"):
        register("POST", client_path(f"{ROOM}/{action}"), membership_servlet(action), action)
    register(
        "PUT",
        client_path(ROOM + "/send/(?P<event_type>[^/]+)/(?P<txn_id>[^/]+)"),
        send,
        "send",
    )
    register("POST", client_path(ROOM + "/send/(?P<event_type>[^/]+)"), send_without_txn, "send")
    register(
        "PUT",
        client_path(ROOM + "/redact/(?P<event_id>[^/]+)/(?P<txn_id>[^/]+)"),
        redact,
        "redact",
    )
    register("POST", client_path(ROOM + "/redact/(?P<event_id>[^/]+)"), redact, "redact")
    state_path = ROOM + "/state/(?P<event_type>[^/]+)"
    register("PUT", client_path(state_path), put_state, "state")
    register("PUT", client_path(state_path + "/(?P<state_key>[^/]*)"), put_state, "state")
    register("GET", client_path(state_path), get_state_event, "state")
    register("GET", client_path(state_path + "/(?P<state_key>[^/]*)"), get_state_event, "state")
    register("GET", client_path(ROOM + "/state"), get_state, "state")
    register("GET", client_path(ROOM + "/messages"), messages, "messages")
    register("GET", client_path(ROOM + "/members"), members, "members")
    event_path = ROOM + "/event/(?P<event_id>[^/]+)"
    register("GET", client_path(event_path), get_event, "room_event")
    register("GET", client_path(ROOM + "/context/(?P<event_id>[^/]+)"), context, "context")
    register("POST", client_path(ROOM + "/forget"), forget, "forget")
    register("GET", client_path(ROOM + "/joined_members"), joined_members, "joined_members")
    register("GET", client_path("/joined_rooms"), joined_rooms, "joined_rooms")
    register("PUT", client_path(ROOM + "/typing/(?P<user_id>[^/]+)"), typing, "typing")
    register(
        "POST",
        client_path(ROOM + "/receipt/(?P<receipt_type>[^/]+)/(?P<event_id>[^/]+)"),
        receipt,
        "receipt",
    )
    register("POST", client_path(ROOM + "/read_markers"), read_markers, "read_markers")


async def read_messages(
    handlers: ClientHandlers,
    requester: Requester,
    request: Request,
    room_id: str,
    max_limit: int,
    as_admin: bool = False,
) -> dict[str, Any]:
    """``/messages`` (the client API's, and the admin API's with
    ``as_admin``): its query parameters read, the page with its bundles."""
    check_room_id(room_id)
    direction = query_string(request, "dir", "b")
    if direction not in ("b", "f"):
        raise SynapseError(400, "'dir' must be b or f", Codes.INVALID_PARAM)
    limit = query_int(request, "limit", 10, maximum=max_limit)
    assert limit is not None
    event_filter, event_format = parse_room_event_filter(query_string(request, "filter"))
    page = await handlers.pagination.get_messages(
        requester,
        room_id,
        query_string(request, "from"),
        query_string(request, "to"),
        direction,
        limit,
        event_filter,
        event_format,
        as_admin=as_admin,
    )
    if not event_format.federation:  # federation's ``unsigned`` holds no bundles
        await handlers.relations.add_bundles(room_id, page["chunk"], requester.user_id)
    return page


async def read_context(
    handlers: ClientHandlers,
    requester: Requester,
    request: Request,
    room_id: str,
    event_id: str,
    as_admin: bool = False,
) -> dict[str, Any]:
    """``/context`` (the client API's, and the admin API's with ``as_admin``)."""
    check_room_id(room_id)
    check_identifier_text(event_id, "eventId")
    limit = query_int(request, "limit", 10, maximum=MAX_CONTEXT_LIMIT)
    assert limit is not None
    event_filter, event_format = parse_room_event_filter(query_string(request, "filter"))
    context = await handlers.pagination.get_context(
        requester, room_id, event_id, limit, event_filter, event_format, as_admin=as_admin
    )
    if not event_format.federation:
        served = [context["event"], *context["events_before"], *context["events_after"]]
        await handlers.relations.add_bundles(room_id, served, requester.user_id)
    return context
