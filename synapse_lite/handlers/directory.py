"""The room directory: aliases, the public room list and the user directory.

Aliases and the directory setting are rows of their own, not streams: the
process serving the request writes them and every process reads them (see
``storage/databases/main/profile.py``). Only aliases of this server can be
made here (no federation, and no squatting another server's names).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.api.errors import AuthError, Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import check_room_alias
from synapse_lite.events import Event, EventSpec
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.event_auth import RoomAuthState
from synapse_lite.handlers.profile import localpart
from synapse_lite.handlers.visibility import load_room_visibility
from synapse_lite.http.fields import (
    get_bool,
    get_dict,
    get_list,
    get_optional_int,
    get_optional_str,
)

if TYPE_CHECKING:
    from synapse_lite.appservice.queries import AppServiceQueries
    from synapse_lite.appservice.registration import ApplicationService
    from synapse_lite.clock import Clock
    from synapse_lite.federation.queries import FederationQueries
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

#: The most rooms one ``/publicRooms`` page and users one search return.
MAX_PUBLIC_ROOMS_PAGE = 500
MAX_USER_SEARCH_LIMIT = 100

BAD_ALIAS = "M_BAD_ALIAS"

#: The longest network id an application service may publish rooms under.
MAX_NETWORK_ID = 255

#: The longest ``generic_search_term`` and user search term accepted.
MAX_SEARCH_TERM = 1000
#: The most room types one ``filter.room_types`` may name.
MAX_ROOM_TYPES = 50


@attr.s(slots=True, frozen=True, auto_attribs=True)
class PublicRoomsQuery:
    """What one ``/publicRooms`` request asks for (client or federation)."""

    limit: int | None = None
    since: str | None = None
    search_term: str | None = None
    #: ``None``: every type; else the types wanted (``None`` in it: rooms
    #: without a type).
    room_types: tuple[str | None, ...] | None = None
    instance_id: str | None = None
    all_networks: bool = False

    def to_body(self) -> dict[str, Any]:
        """The ``POST /publicRooms`` body asking the same (for another server)."""
        body: dict[str, Any] = {}
        if self.limit is not None:
            body["limit"] = self.limit
        if self.since is not None:
            body["since"] = self.since
        search_filter: dict[str, Any] = {}
        if self.search_term is not None:
            search_filter["generic_search_term"] = self.search_term
        if self.room_types is not None:
            search_filter["room_types"] = list(self.room_types)
        if search_filter:
            body["filter"] = search_filter
        if self.instance_id is not None:
            body["third_party_instance_id"] = self.instance_id
        if self.all_networks:
            body["include_all_networks"] = True
        return body


def parse_public_rooms_body(body: dict[str, Any]) -> PublicRoomsQuery:
    """A ``POST /publicRooms`` body (client-server and server-server have
    the same one); 400 for a field of the wrong type."""
    search_filter = get_dict(body, "filter", {})
    room_types: tuple[str | None, ...] | None = None
    if search_filter.get("room_types") is not None:
        types = get_list(search_filter, "room_types")
        if len(types) > MAX_ROOM_TYPES or not all(t is None or isinstance(t, str) for t in types):
            raise SynapseError(
                400,
                f"'filter.room_types' must be a list of at most {MAX_ROOM_TYPES} strings or null",
                Codes.INVALID_PARAM,
            )
        room_types = tuple(types)
    return PublicRoomsQuery(
        limit=get_optional_int(body, "limit"),
        since=get_optional_str(body, "since", max_length=64),
        search_term=get_optional_str(
            search_filter, "generic_search_term", max_length=MAX_SEARCH_TERM
        ),
        room_types=room_types,
        instance_id=get_optional_str(body, "third_party_instance_id", max_length=512),
        all_networks=get_bool(body, "include_all_networks", False),
    )


class DirectoryHandler:
    def __init__(
        self,
        store: GenericWorkerStore,
        server_name: str,
        clock: Clock,
        events: EventCreationHandler,
        app_service_queries: AppServiceQueries,
        remote: FederationQueries | None = None,
    ) -> None:
        """``app_service_queries``: asks application services about aliases
        nobody has yet; ``remote``: asks other servers about theirs."""
        self._app_service_queries = app_service_queries
        self._remote = remote
        self._store = store
        self._server_name = server_name
        self._clock = clock
        self._events = events

    async def _auth_state(self, room_id: str) -> RoomAuthState:
        state_ids = await self._store.get_current_state_ids(room_id)
        events = await self._store.get_events(list(state_ids.values()))
        return RoomAuthState.from_events(room_id, events.values())

    async def _check_can_edit(self, user_id: str, room_id: str, what: str) -> None:
        """403 unless ``user_id`` is joined to the room with the power to set
        its ``m.room.canonical_alias`` (the level that rules its aliases)."""
        state = await self._auth_state(room_id)
        if state.members.get(user_id) != "join":
            raise AuthError(403, "You are not in this room")
        if state.user_level(user_id) < state.required_level("m.room.canonical_alias", True):
            raise AuthError(403, f"You do not have the power to change this room's {what}")

    # Aliases

    async def create_alias(self, requester: Requester, alias: str, room_id: str) -> None:
        check_room_alias(alias, self._server_name)
        self._app_service_queries.check_alias_claim(alias, requester.app_service)
        if not await self._store.room_exists(room_id):
            raise NotFoundError("Unknown room")
        # A service places aliases of its namespace (check_alias_claim) on
        # rooms it need not be in: a bridge maps rooms it was never invited to.
        if requester.app_service is None and requester.user_id not in (
            await self._store.get_users_in_room(room_id)
        ):
            raise AuthError(403, "You are not in this room")
        if not await self._store.create_alias(alias, room_id, requester.user_id):
            raise SynapseError(409, "That room alias already exists", Codes.UNKNOWN)

    async def resolve_alias(self, alias: str) -> str:
        """The room ``alias`` names (400 for a malformed alias, 404 for an
        unknown one)."""
        check_room_alias(alias)
        room_id = await self.room_for_alias(alias)
        if room_id is None:
            raise NotFoundError("Room alias not found")
        return room_id

    async def get_alias(self, alias: str) -> dict[str, Any]:
        """``GET /directory/room/{alias}``: ours, or another server's alias as
        that server answers (``/query/directory``)."""
        check_room_alias(alias)
        if self._remote is not None and alias.split(":", 1)[1] != self._server_name:
            try:
                return await self._remote.directory(alias)
            except NotFoundError:
                raise NotFoundError("Room alias not found") from None
        return {"room_id": await self.resolve_alias(alias), "servers": [self._server_name]}

    async def room_for_alias(self, alias: str) -> str | None:
        """The room ``alias`` names (an application service whose namespace
        covers an unknown alias is asked), or None."""
        return await self._app_service_queries.room_for_alias(alias)

    async def delete_alias(self, requester: Requester, alias: str) -> None:
        """The alias's creator may delete it, and so may whoever can set the
        room's canonical alias."""
        check_room_alias(alias)
        found = await self._store.get_alias(alias)
        if found is None:
            raise NotFoundError("Room alias not found")
        room_id, creator = found
        if requester.user_id != creator:
            await self._check_can_edit(requester.user_id, room_id, "aliases")
        await self._store.delete_alias(alias)
        await self._drop_from_canonical_alias(requester, room_id, alias)

    async def _drop_from_canonical_alias(
        self, requester: Requester, room_id: str, alias: str
    ) -> None:
        """A deleted alias leaves the room's ``m.room.canonical_alias`` too (a
        new event from the deleter, when they have the power to send it)."""
        event_id = (await self._store.get_current_state_ids(room_id)).get(
            ("m.room.canonical_alias", "")
        )
        event = await self._store.get_event(event_id) if event_id else None
        if event is None:
            return
        content = dict(event.content)
        alt = content.get("alt_aliases")
        changed = False
        if content.get("alias") == alias:
            del content["alias"]
            changed = True
        if isinstance(alt, list) and alias in alt:
            content["alt_aliases"] = [a for a in alt if a != alias]
            changed = True
        if not changed:
            return
        spec = EventSpec(
            type="m.room.canonical_alias",
            state_key="",
            sender=requester.user_id,
            content=content,
            origin_server_ts=self._clock.time_msec(),
        )
        try:
            await self._events.send_events(room_id, [spec])
        except SynapseError:
            # Not allowed to (no power, left the room): the alias is gone all
            # the same; the stale canonical alias no longer resolves.
            pass

    async def get_room_aliases(self, requester: Requester, room_id: str) -> list[str]:
        """The room's local aliases, for whoever may read the room now."""
        if not await self._store.room_exists(room_id):
            raise AuthError(403, "You are not in this room")
        visibility = await load_room_visibility(self._store, requester.user_id, room_id)
        joined = requester.user_id in await self._store.get_users_in_room(room_id)
        if not joined and visibility.history_visibility != "world_readable":
            raise AuthError(403, "You are not in this room")
        return await self._store.get_aliases_for_room(room_id)

    async def check_canonical_alias(self, room_id: str, content: dict[str, Any]) -> None:
        """An ``m.room.canonical_alias`` may only name aliases that exist and
        point to its room (400 ``M_BAD_ALIAS`` otherwise)."""
        aliases: list[object] = []
        if content.get("alias") is not None:
            aliases.append(content["alias"])
        alt = content.get("alt_aliases")
        if alt is not None:
            if not isinstance(alt, list):
                raise SynapseError(400, "'alt_aliases' must be a list", Codes.BAD_JSON)
            aliases.extend(alt)
        for alias in aliases:
            if not isinstance(alias, str):
                raise SynapseError(400, "Aliases must be strings", Codes.BAD_JSON)
            check_room_alias(alias)
            found = await self._store.get_alias(alias)
            if found is None or found[0] != room_id:
                raise SynapseError(400, f"{alias[:255]} does not point to this room", BAD_ALIAS)

    # The public room list

    async def get_visibility(self, requester: Requester, room_id: str) -> str:
        """Anyone may see that a listed room is listed; of an unlisted room,
        only those who may read it learn that it exists (404 for others)."""
        listed = await self._store.is_room_in_directory(room_id)
        if listed is None:
            raise NotFoundError("Unknown room")
        if not listed:
            visibility = await load_room_visibility(self._store, requester.user_id, room_id)
            if not visibility.may_read:
                raise NotFoundError("Unknown room")
        return "public" if listed else "private"

    async def set_visibility(self, requester: Requester, room_id: str, visibility: str) -> None:
        """List or unlist a room: its members who may change its state, or
        a server admin (who curates the directory, in the room or not, as
        the admin UIs do)."""
        if not await self._store.room_exists(room_id):
            raise NotFoundError("Unknown room")
        user = await self._store.get_user(requester.user_id)
        if user is None or not user["admin"]:
            await self._check_can_edit(requester.user_id, room_id, "directory listing")
        await self._store.set_room_in_directory(room_id, visibility == "public")

    async def set_appservice_visibility(
        self, service: ApplicationService, network_id: str, room_id: str, visibility: str
    ) -> None:
        """Publish (``public``) or withdraw ``room_id`` in the list of the
        service's network ``network_id``. Any network id is accepted (the
        service names its own networks; see docs/appservices.md), the room
        must exist."""
        if not network_id or len(network_id) > MAX_NETWORK_ID or "|" in network_id:
            raise SynapseError(400, "Bad network id", Codes.INVALID_PARAM)
        if not await self._store.room_exists(room_id):
            raise NotFoundError("Unknown room")
        await self._store.set_room_in_appservice_list(
            service.id, network_id, room_id, visibility == "public"
        )

    async def public_rooms(self, query: PublicRoomsQuery) -> dict[str, Any]:
        """A page of the listed rooms (oldest first). ``since`` is the
        ``next_batch``/``prev_batch`` of another page: ``o<offset>``.
        Without ``instance_id``: the server's own list, plus with
        ``all_networks`` every application service's lists; with it
        (``<as_id>|<network_id>``, as ``/thirdparty/protocols`` names the
        instances) that network's list only. ``room_types`` keeps the rooms
        of those types (``None``: rooms without one)."""
        limit, since, search_term = query.limit, query.since, query.search_term
        instance_id, all_networks = query.instance_id, query.all_networks
        offset = 0
        if since is not None:
            if not since.startswith("o") or not since[1:].isdigit() or len(since) > 12:
                raise SynapseError(400, "Unknown 'since' token", Codes.INVALID_PARAM)
            offset = int(since[1:])
        if instance_id is not None:
            if all_networks:
                raise SynapseError(
                    400,
                    "'third_party_instance_id' cannot be used with 'include_all_networks'",
                    Codes.INVALID_PARAM,
                )
            service_id, bar, network_id = instance_id.partition("|")
            if not bar:
                raise SynapseError(400, "Unknown 'third_party_instance_id'", Codes.INVALID_PARAM)
            room_ids = await self._store.get_appservice_list_room_ids((service_id, network_id))
        else:
            room_ids = await self._store.get_directory_room_ids()
            if all_networks:
                seen = set(room_ids)
                for room_id in await self._store.get_appservice_list_room_ids(None):
                    if room_id not in seen:
                        seen.add(room_id)
                        room_ids.append(room_id)
        entries = [await self.room_entry(room_id) for room_id in room_ids]
        if search_term:
            term = search_term.casefold()
            entries = [
                e
                for e in entries
                if any(
                    term in str(e.get(k, "")).casefold()
                    for k in ("name", "topic", "canonical_alias")
                )
            ]
        if query.room_types is not None:
            wanted = set(query.room_types)
            entries = [e for e in entries if e.get("room_type") in wanted]
        size = MAX_PUBLIC_ROOMS_PAGE if limit is None else max(0, min(limit, MAX_PUBLIC_ROOMS_PAGE))
        page = entries[offset : offset + size]
        result: dict[str, Any] = {"chunk": page, "total_room_count_estimate": len(entries)}
        if offset + size < len(entries):
            result["next_batch"] = f"o{offset + size}"
        if offset > 0:
            result["prev_batch"] = f"o{max(0, offset - size)}"
        return result

    async def server_public_rooms(
        self, server: str | None, query: PublicRoomsQuery
    ) -> dict[str, Any]:
        """The public rooms of ``server``: ours when it is us or ``None``,
        else asked of that server (``/_matrix/federation/v1/publicRooms``)
        and its answer checked (``FederationQueries.public_rooms``)."""
        if server is None or server == self._server_name:
            return await self.public_rooms(query)
        if self._remote is None:
            raise SynapseError(
                400, "Other servers' room directories are not served here", Codes.INVALID_PARAM
            )
        return await self._remote.public_rooms(server, query)

    async def room_entry(self, room_id: str) -> dict[str, Any]:
        """The room's ``/publicRooms`` chunk from its current state (also the
        core of a spaces hierarchy room summary)."""
        state_ids = await self._store.get_current_state_ids(room_id)
        wanted = {
            key: state_ids[(key, "")]
            for key in (
                "m.room.name",
                "m.room.topic",
                "m.room.canonical_alias",
                "m.room.avatar",
                "m.room.join_rules",
                "m.room.history_visibility",
                "m.room.guest_access",
                "m.room.create",
            )
            if (key, "") in state_ids
        }
        events = await self._store.get_events(list(wanted.values()))

        def field(event_type: str, key: str) -> Any:
            event: Event | None = events.get(wanted.get(event_type, ""))
            value = event.content.get(key) if event is not None else None
            return value if isinstance(value, str) else None

        joined = await self._store.get_users_in_room(room_id)
        entry: dict[str, Any] = {
            "room_id": room_id,
            "num_joined_members": len(joined),
            "world_readable": field("m.room.history_visibility", "history_visibility")
            == "world_readable",
            "guest_can_join": field("m.room.guest_access", "guest_access") == "can_join",
            "join_rule": field("m.room.join_rules", "join_rule") or "invite",
        }
        for event_type, key, name in (
            ("m.room.name", "name", "name"),
            ("m.room.topic", "topic", "topic"),
            ("m.room.canonical_alias", "alias", "canonical_alias"),
            ("m.room.avatar", "url", "avatar_url"),
            ("m.room.create", "type", "room_type"),
        ):
            value = field(event_type, key)
            if value is not None:
                entry[name] = value
        return entry

    # The user directory

    async def search_users(self, requester: Requester, term: str, limit: int) -> dict[str, Any]:
        """Users who share a room with the requester or are in a public room,
        whose id or display name contains ``term`` (case-insensitively); a
        user of another server by the profile their join event shows."""
        limit = max(0, min(limit, MAX_USER_SEARCH_LIMIT))
        candidates = await self._store.get_users_visible_to(requester.user_id)
        profiles = await self._store.get_profiles(sorted(candidates))
        # Other servers' users have no profile here: the one their
        # membership shows in a room with us.
        others = sorted(u for u in candidates if u not in profiles)
        if others:
            profiles.update(await self._store.get_member_profiles(others))
        needle = term.casefold()
        matches = []
        for user_id in sorted(candidates):
            profile = profiles.get(user_id) or {"displayname": localpart(user_id)}
            name = profile.get("displayname")
            if needle in user_id.casefold() or (name and needle in name.casefold()):
                result = {"user_id": user_id}
                if name:
                    result["display_name"] = name
                if profile.get("avatar_url"):
                    result["avatar_url"] = str(profile["avatar_url"])
                matches.append(result)
        return {"results": matches[:limit], "limited": len(matches) > limit}
