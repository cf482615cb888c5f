"""Creating rooms: the receiving process picks the room id and its events
writer, builds the initial events from the preset, and has the writer persist
them in one request.

Presets (the spec's defaults): ``private_chat`` and ``trusted_private_chat``
are invite-only with ``shared`` history and guests may join;
``trusted_private_chat`` also gives invitees the creator's power level;
``public_chat`` is public with ``shared`` history and no guests (an
``m.room.guest_access`` of ``forbidden``, as the spec's preset table has it,
so that an upgrade carries the setting over explicitly). ``initial_state``
overrides the preset's events. Invitees of other servers are invited
after the room's first events are persisted, each by the federation invite
flow (``/v2/invite`` to their server), as ``POST /rooms/{id}/invite`` does;
one that fails is logged and skipped: the room exists by then, and its id is
what the client needs to invite them again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import THIRD_PARTY_INVITES_REFUSED, Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import (
    check_identifier_text,
    check_room_alias,
    check_user_id,
    is_mine_id,
    new_room_id,
)
from synapse_lite.api.room_versions import (
    DEFAULT_ROOM_VERSION,
    RoomVersion,
    room_version_of_request,
)
from synapse_lite.events import EventSpec
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.event_auth import check_power_levels_content
from synapse_lite.handlers.message import hashed_room_id
from synapse_lite.handlers.profile import member_content, profile_of
from synapse_lite.http.fields import get_bool, get_dict, get_list, get_optional_str

if TYPE_CHECKING:
    from synapse_lite.appservice.queries import AppServiceQueries
    from synapse_lite.clock import Clock
    from synapse_lite.handlers.federation_join import FederationJoinHandler
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore
    from synapse_lite.streams.writers import WritersDirectory

logger = logging.getLogger(__name__)

PRESETS = {
    "private_chat": {"join_rule": "invite", "history": "shared", "guests": "can_join"},
    "trusted_private_chat": {"join_rule": "invite", "history": "shared", "guests": "can_join"},
    "public_chat": {"join_rule": "public", "history": "shared", "guests": "forbidden"},
}
#: Invitees in one createRoom (each is an event in the creating request).
MAX_INVITES = 100
MAX_INITIAL_STATE = 50


def create_content(
    version: RoomVersion,
    creator: str,
    requested: dict[str, Any],
    more_creators: Sequence[str] = (),
) -> dict[str, Any]:
    """The content of a new room's ``m.room.create``: what the client asked
    for, with the version the server chose (whatever the client put there),
    and the creator where the version names one (1-10; from 11 the sender is
    the creator). Version 12: ``additional_creators`` is the requested
    one's users then ``more_creators`` (a trusted private chat's invitees),
    without duplicates or the creator (400 for a requested value that is
    not a list of user ids); left out when empty."""
    content = {k: v for k, v in requested.items() if k not in ("creator", "room_version")}
    content["room_version"] = version.identifier
    if version.creator_in_create_content:
        content["creator"] = creator
    if version.hashed_room_ids:
        requested_creators = content.pop("additional_creators", [])
        if not isinstance(requested_creators, list):
            raise SynapseError(400, "'additional_creators' must be a list", Codes.BAD_JSON)
        additional = [
            check_user_id(u, "additional_creators") for u in (*requested_creators, *more_creators)
        ]
        additional = [u for u in dict.fromkeys(additional) if u != creator]
        if additional:
            content["additional_creators"] = additional
    return content


def default_power_levels(
    creator: str, preset: str, invitees: list[str], version: RoomVersion
) -> dict[str, Any]:
    """The preset's power levels. Before version 12 the creator (and a
    trusted private chat's invitees) get 100 in ``users``; from 12 they are
    the room's creators, whose power is unlimited and never listed, and a
    tombstone needs 150, above ``state_default`` as the spec requires."""
    users: dict[str, int] = {}
    if not version.hashed_room_ids:
        users[creator] = 100
        if preset == "trusted_private_chat":
            users.update({u: 100 for u in invitees})
    return {
        "users": users,
        "users_default": 0,
        "events": {
            "m.room.name": 50,
            "m.room.power_levels": 100,
            "m.room.history_visibility": 100,
            "m.room.canonical_alias": 50,
            "m.room.avatar": 50,
            "m.room.tombstone": 150 if version.hashed_room_ids else 100,
            "m.room.server_acl": 100,
            "m.room.encryption": 100,
        },
        "events_default": 0,
        "state_default": 50,
        "ban": 50,
        "kick": 50,
        "redact": 50,
        # Anyone in a private room may invite; public rooms need moderators.
        "invite": 50 if preset == "public_chat" else 0,
    }


class RoomCreationHandler:
    """``POST /createRoom``."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        server_name: str,
        events: EventCreationHandler,
        writers: WritersDirectory,
        event_writers: Callable[[], Sequence[str]],
        app_service_queries: AppServiceQueries,
        remote: FederationJoinHandler | None = None,
    ) -> None:
        """``event_writers()``: the events writers this process knows of now
        (a new room goes to one of them by the events stream's rule in
        ``writers``). ``remote``: invites users of other servers (None: this
        server does not federate, and such invitees are refused)."""
        self._remote = remote
        self._store = store
        self._clock = clock
        self._server_name = server_name
        self._events = events
        self._writers = writers
        self._event_writers = event_writers
        self._app_service_queries = app_service_queries

    async def create_room(self, requester: Requester, body: dict[str, Any]) -> str:
        """Validate the request, build the initial events, persist them on the
        new room's writer; returns the room id."""
        user_id = requester.user_id
        alias_name = get_optional_str(body, "room_alias_name", max_length=200)
        alias = None
        if alias_name is not None:
            alias = check_room_alias(f"#{alias_name}:{self._server_name}", self._server_name)
            self._app_service_queries.check_alias_claim(alias, requester.app_service)
            if await self._store.get_alias(alias) is not None:
                raise SynapseError(400, "That room alias is taken", Codes.ROOM_IN_USE)
        visibility = get_optional_str(body, "visibility") or "private"
        if visibility not in ("public", "private"):
            raise SynapseError(400, "'visibility' must be public or private", Codes.INVALID_PARAM)
        preset = get_optional_str(body, "preset") or (
            "public_chat" if visibility == "public" else "private_chat"
        )
        if preset not in PRESETS:
            raise SynapseError(400, f"Unknown preset {preset[:50]!r}", Codes.INVALID_PARAM)
        version = DEFAULT_ROOM_VERSION
        if body.get("room_version") is not None:
            version = room_version_of_request(body["room_version"], "room_version")
        name = get_optional_str(body, "name", max_length=255)
        topic = get_optional_str(body, "topic", max_length=4096)
        is_direct = get_bool(body, "is_direct", False)
        invitees = await self._check_invitees(get_list(body, "invite", []), user_id)
        if get_list(body, "invite_3pid", []):
            # Third-party invites are not built (docs/client-api.md).
            raise SynapseError(
                400,
                THIRD_PARTY_INVITES_REFUSED + ": invite by Matrix user id",
                Codes.SERVER_NOT_TRUSTED,
            )
        creation_content = dict(get_dict(body, "creation_content", {}))
        overrides = get_dict(body, "power_level_content_override", {})
        initial_state = self._parse_initial_state(get_list(body, "initial_state", []))

        power_levels = {**default_power_levels(user_id, preset, invitees, version), **overrides}
        check_power_levels_content(power_levels, version)
        more_creators = invitees if preset == "trusted_private_chat" else []
        settings = PRESETS[preset]
        now = self._clock.time_msec()

        def state(event_type: str, content: dict[str, Any], state_key: str = "") -> EventSpec:
            return EventSpec(event_type, state_key, user_id, content, now)

        specs = await self.founding_events(
            user_id, version, creation_content, power_levels, now, more_creators
        )
        fixed = {(s.type, s.state_key) for s in specs}
        # The preset's state, which initial_state overrides (the spec).
        preset_state = {
            "m.room.join_rules": {"join_rule": settings["join_rule"]},
            "m.room.history_visibility": {"history_visibility": settings["history"]},
            "m.room.guest_access": {"guest_access": settings["guests"]},
        }
        given = {(t, key): content for t, key, content in initial_state}
        specs += [state(t, given.pop((t, ""), content)) for t, content in preset_state.items()]
        specs += [
            state(t, content, key) for (t, key), content in given.items() if (t, key) not in fixed
        ]
        if name is not None:
            specs.append(state("m.room.name", {"name": name}))
        if topic is not None:
            specs.append(state("m.room.topic", {"topic": topic}))
        if alias is not None:
            specs.append(state("m.room.canonical_alias", {"alias": alias}))
        local_invitees = [u for u in invitees if is_mine_id(u, self._server_name)]
        for invitee in local_invitees:
            content = member_content("invite", await profile_of(self._store, invitee))
            if is_direct:
                content["is_direct"] = True
            specs.append(state("m.room.member", content, invitee))

        room_id = self.new_room_id(version, specs[0])
        # The alias is claimed before the room exists, so that two rooms
        # cannot both get it; it is given back if the room is not created.
        if alias is not None and not await self._store.create_alias(alias, room_id, user_id):
            raise SynapseError(400, "That room alias is taken", Codes.ROOM_IN_USE)
        try:
            await self.persist_new_room(room_id, specs)
        except Exception:
            if alias is not None:
                await self._store.delete_alias(alias)
            raise
        if visibility == "public":
            await self._store.set_room_in_directory(room_id, True)
        for invitee in invitees:
            if invitee not in local_invitees:
                await self._invite_remote(user_id, room_id, invitee, is_direct)
        return room_id

    async def _invite_remote(self, sender: str, room_id: str, target: str, is_direct: bool) -> None:
        """Invite ``target`` of another server into the new room (the
        member event's content carries no profile: theirs is their server's)."""
        assert self._remote is not None  # _check_invitees refused them otherwise
        content: dict[str, Any] = {"membership": "invite"}
        if is_direct:
            content["is_direct"] = True
        try:
            await self._remote.invite(sender, room_id, target, content)
        except SynapseError as e:
            logger.warning("createRoom %s: could not invite %s: %s", room_id, target, e.msg)

    async def founding_events(
        self,
        creator: str,
        version: RoomVersion,
        creation_content: dict[str, Any],
        power_levels: dict[str, Any],
        now: int,
        more_creators: Sequence[str] = (),
    ) -> list[EventSpec]:
        """The first events of every new room: its create event (see
        :func:`create_content` for ``more_creators``), the creator's join
        (with their profile), its power levels."""
        return [
            EventSpec(
                "m.room.create",
                "",
                creator,
                create_content(version, creator, creation_content, more_creators),
                now,
            ),
            EventSpec(
                "m.room.member",
                creator,
                creator,
                member_content("join", await profile_of(self._store, creator)),
                now,
            ),
            EventSpec("m.room.power_levels", "", creator, power_levels, now),
        ]

    def new_room_id(self, version: RoomVersion, create: EventSpec) -> str:
        """The id of a new room of ``version`` whose create event is
        ``create``: random with our server name before version 12, from
        12 the create event's id (:func:`hashed_room_id`)."""
        if version.hashed_room_ids:
            return hashed_room_id(version, self._server_name, create)
        return new_room_id(self._server_name)

    async def persist_new_room(self, room_id: str, specs: list[EventSpec]) -> None:
        """Have the writer a new room goes to persist its first events
        (``specs``, the create event first) in one request."""
        writer = self._writers.writer_for("events", room_id, among=self._event_writers())
        await self._events.send_events(room_id, specs, new_room_writer=writer)

    async def _check_invitees(self, invite: list[Any], creator: str) -> list[str]:
        if len(invite) > MAX_INVITES:
            raise SynapseError(400, f"At most {MAX_INVITES} invites", Codes.INVALID_PARAM)
        invitees: list[str] = []
        for value in invite:
            user_id = check_user_id(value, "invite")
            if not is_mine_id(user_id, self._server_name):
                if self._remote is None:
                    raise SynapseError(
                        400,
                        "This server does not federate: invite local users",
                        Codes.INVALID_PARAM,
                    )
            elif await self._store.get_user(user_id) is None:
                raise NotFoundError(f"Unknown user {user_id}")
            if user_id != creator and user_id not in invitees:
                invitees.append(user_id)
        return invitees

    @staticmethod
    def _parse_initial_state(items: list[Any]) -> list[tuple[str, str, dict[str, Any]]]:
        if len(items) > MAX_INITIAL_STATE:
            raise SynapseError(400, "Too many initial_state events", Codes.INVALID_PARAM)
        result = []
        for item in items:
            if not isinstance(item, dict):
                raise SynapseError(400, "initial_state entries must be objects", Codes.BAD_JSON)
            event_type = check_identifier_text(item.get("type"), "type")
            if event_type == "m.room.member":
                raise SynapseError(400, "Use 'invite' for members", Codes.INVALID_PARAM)
            state_key = check_identifier_text(item.get("state_key", ""), "state_key")
            result.append((event_type, state_key, get_dict(item, "content")))
        return result
