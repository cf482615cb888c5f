"""Room upgrades: ``POST /rooms/{roomId}/upgrade`` replaces a room by a new
one of another version, and a user's settings follow them into it.

The upgrade does what the spec's "server behaviour" lists, in an order that
leaves nothing half done that can be checked beforehand:

1. the upgrader must be joined with the power to send ``m.room.tombstone``;
2. the new room's first events are built and checked, here, against the
   new version's rules: its create event (``predecessor``, the version, the
   old room's ``m.federate`` and room type), the upgrader's join, the power
   levels (the upgrader lifted to whatever the copied state needs, put back
   by a last power levels event), the transferable state, the bans;
3. the tombstone goes into the old room (its id is the ``predecessor``'s
   ``event_id``, the old room's last event);
4. the new room is created on its writer in one request, with that state.
   To version 12, 4 comes before 3: the new room's id is its create
   event's, so the create event cannot name the tombstone that names the
   room (``predecessor`` has only ``room_id``, as the spec allows); the
   upgrader and the request's ``additional_creators`` are the new room's
   creators, so they are left out of its power levels' ``users``;
5. local aliases move to the new room, the old room's canonical alias is
   emptied and its power levels restricted (``events_default`` and
   ``invite`` to at least 50 and above ``users_default``; skipped when the
   upgrader lacks the power), its directory listing moves;
6. the upgrader's tags, direct-chat marks and push rules of the old room
   are copied to the new one. Every other user gets theirs when they join
   the new room (:class:`UpgradedRoomUserState`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import AuthError, NotFoundError, SynapseError
from synapse_lite.api.identifiers import new_room_id
from synapse_lite.api.room_versions import RoomVersion, room_version_of_request
from synapse_lite.events import Event, EventSpec
from synapse_lite.handlers.auth import Requester
from synapse_lite.handlers.event_auth import (
    LEVEL_DEFAULTS,
    LEVEL_MAPS,
    RoomAuthState,
    parse_level,
)
from synapse_lite.replication.http.writes import PushRuleEdit

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.handlers.account_data import AccountDataHandler
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.handlers.push_rules import PushRulesHandler
    from synapse_lite.handlers.room import RoomCreationHandler
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: State copied into the new room as it is (the spec's recommended list,
#: less the power levels, handled on their own); the canonical alias follows
#: the aliases.
TRANSFERRED_STATE = (
    "m.room.join_rules",
    "m.room.history_visibility",
    "m.room.guest_access",
    "m.room.server_acl",
    "m.room.encryption",
    "m.room.name",
    "m.room.avatar",
    "m.room.topic",
    "m.room.canonical_alias",
)
#: What ``m.room.create`` content of the old room the new one keeps.
KEPT_CREATE_CONTENT = ("m.federate", "type")
#: The least level that sending in, and inviting to, an upgraded room needs.
RESTRICTED_LEVEL = 50


def integer_levels(content: dict[str, Any], room_version: RoomVersion) -> dict[str, Any]:
    """Power levels with every level an integer (as every version reads
    them), for a new room whose version may refuse strings of digits."""
    levels = dict(content)
    for key in LEVEL_DEFAULTS:
        if key in levels:
            level = parse_level(levels[key], room_version)
            if level is None:
                del levels[key]
            else:
                levels[key] = level
    for key in LEVEL_MAPS:
        value = levels.get(key)
        if isinstance(value, dict):
            levels[key] = {
                name: level
                for name, raw in value.items()
                if (level := parse_level(raw, room_version)) is not None
            }
    return levels


def with_predecessor(create: EventSpec, predecessor: dict[str, str]) -> EventSpec:
    """The new room's create event naming the old room."""
    content = {**create.content, "predecessor": predecessor}
    return EventSpec(create.type, "", create.sender, content, create.origin_server_ts)


def creators_of_request(creation_content: dict[str, Any]) -> list[str]:
    """The users of an upgrade's ``additional_creators`` (what is not a
    string is refused later, by :func:`create_content`)."""
    value = creation_content.get("additional_creators")
    return [u for u in value if isinstance(u, str)] if isinstance(value, list) else []


def join_rules_for(content: dict[str, Any], version: RoomVersion) -> dict[str, Any]:
    """The old room's join rules as the new version can have them: a rule
    it lacks falls back to the nearest it has (knocking or restricted rules
    to ``invite``, ``knock_restricted`` to whichever half it has)."""
    rule = content.get("join_rule")
    if rule in version.join_rules:
        return content
    fallback = "invite"
    if rule == "knock_restricted":
        fallback = next((r for r in ("restricted", "knock") if r in version.join_rules), "invite")
    kept = {k: v for k, v in content.items() if k != "allow" or fallback == "restricted"}
    return {**kept, "join_rule": fallback}


class UpgradedRoomUserState:
    """Carries a user's own settings of a room into the room replacing it:
    room tags, the room's place in ``m.direct``, and push rules naming the
    room (its room rule, override and underride rules matching its id).
    Each write goes to its stream's writer."""

    def __init__(
        self,
        store: GenericWorkerStore,
        account_data: AccountDataHandler,
        push_rules: PushRulesHandler,
    ) -> None:
        self._store = store
        self._account_data = account_data
        self._push_rules = push_rules

    async def on_join(self, user_id: str, room_id: str) -> None:
        """``user_id`` joined ``room_id``: if it replaces a room they were in,
        copy their settings of that room. Best effort: the join is made, so
        a writer that cannot be reached now is logged, not the join's error."""
        try:
            await self._on_join(user_id, room_id)
        except SynapseError as e:
            logger.warning("Settings of %s not carried into %s: %s", user_id, room_id, e)

    async def _on_join(self, user_id: str, room_id: str) -> None:
        create_id = (await self._store.get_current_state_ids(room_id)).get(("m.room.create", ""))
        create = await self._store.get_event(create_id) if create_id else None
        predecessor = create.content.get("predecessor") if create else None
        old_room = predecessor.get("room_id") if isinstance(predecessor, dict) else None
        if not isinstance(old_room, str) or old_room == room_id:
            return
        membership = await self._store.get_membership_in_room(user_id, old_room)
        if membership is None or membership[0] != "join":
            return
        await self.copy(user_id, old_room, room_id)

    async def copy(self, user_id: str, old_room: str, new_room: str) -> None:
        for tag, content in (await self._store.get_tags_for_room(user_id, old_room)).items():
            await self._account_data.set_tag(user_id, new_room, tag, content)
        direct = (await self._store.get_global_account_data(user_id)).get("m.direct")
        if isinstance(direct, dict):
            changed = {
                other: [*rooms, new_room]
                for other, rooms in direct.items()
                if isinstance(rooms, list) and old_room in rooms and new_room not in rooms
            }
            if changed:
                await self._account_data.set_account_data(
                    user_id, None, "m.direct", {**direct, **changed}
                )
        await self._copy_push_rules(user_id, old_room, new_room)

    async def _copy_push_rules(self, user_id: str, old_room: str, new_room: str) -> None:
        ruleset = await self._push_rules.ruleset(user_id)
        for kind, rules in ruleset.items():
            for rule in rules:
                if rule.get("default") or rule["rule_id"].startswith("."):
                    continue
                conditions = rule.get("conditions") or []
                names_room = kind == "room" and rule["rule_id"] == old_room
                matches_room = any(
                    c.get("key") == "room_id" and c.get("pattern") == old_room for c in conditions
                )
                if not names_room and not matches_room:
                    continue
                body: dict[str, Any] = {"actions": rule["actions"]}
                if kind in ("override", "underride"):
                    body["conditions"] = [
                        {**c, "pattern": new_room}
                        if c.get("key") == "room_id" and c.get("pattern") == old_room
                        else c
                        for c in conditions
                    ]
                rule_id = new_room if names_room else rule["rule_id"].replace(old_room, new_room)
                if rule_id == rule["rule_id"]:
                    continue  # an id not naming the room: it would replace the rule itself
                await self._push_rules.edit(PushRuleEdit(user_id, "put", kind, rule_id, body))
                if rule.get("enabled") is False:
                    await self._push_rules.edit(
                        PushRuleEdit(user_id, "enabled", kind, rule_id, {"value": False})
                    )


class RoomUpgradeHandler:
    """``POST /rooms/{roomId}/upgrade``."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        server_name: str,
        events: EventCreationHandler,
        room_creation: RoomCreationHandler,
        user_state: UpgradedRoomUserState,
    ) -> None:
        self._store = store
        self._clock = clock
        self._server_name = server_name
        self._events = events
        self._room_creation = room_creation
        self._user_state = user_state

    async def upgrade_room(
        self,
        requester: Requester,
        room_id: str,
        new_version: Any,
        additional_creators: Any = None,
    ) -> str:
        """Replace ``room_id`` by a new room of ``new_version``; returns its
        id. ``additional_creators`` (the request's, None when absent): more
        creators of a version 12 room, ignored for other versions."""
        version = room_version_of_request(new_version, "new_version")
        user_id = requester.user_id
        if not await self._store.room_exists(room_id):
            raise NotFoundError("Unknown room")
        state_ids = await self._store.get_current_state_ids(room_id)
        old_state = await self._store.get_events(list(state_ids.values()))
        old = RoomAuthState.from_events(room_id, old_state.values())
        if old.members.get(user_id) != "join":
            raise AuthError(403, "You are not in this room")
        needed = old.required_level("m.room.tombstone", True)
        if old.user_level(user_id) < needed:
            raise AuthError(403, f"You need power level {needed} to upgrade this room")

        by_key = {(e.type, e.state_key): e for e in old_state.values()}
        extra = {} if additional_creators is None else {"additional_creators": additional_creators}
        if version.hashed_room_ids:
            specs = await self._new_room_events(user_id, room_id, version, by_key, extra)
            specs[0] = with_predecessor(specs[0], {"room_id": room_id})
            new_room = self._room_creation.new_room_id(version, specs[0])
            self._check_new_room(new_room, specs)
            await self._room_creation.persist_new_room(new_room, specs)
            await self._send_tombstone(user_id, room_id, new_room)
        else:
            specs = await self._new_room_events(user_id, room_id, version, by_key, {})
            new_room = new_room_id(self._server_name)
            self._check_new_room(new_room, specs)
            tombstone_id = await self._send_tombstone(user_id, room_id, new_room)
            predecessor = {"room_id": room_id, "event_id": tombstone_id}
            specs[0] = with_predecessor(specs[0], predecessor)
            await self._room_creation.persist_new_room(new_room, specs)
        logger.info("%s upgraded %s to %s (version %s)", user_id, room_id, new_room, version)

        await self._store.move_aliases(room_id, new_room)
        await self._close_old_room(user_id, room_id, old, by_key)
        if await self._store.is_room_in_directory(room_id):
            await self._store.set_room_in_directory(new_room, True)
            await self._store.set_room_in_directory(room_id, False)
        try:
            await self._user_state.copy(user_id, room_id, new_room)
        except SynapseError as e:
            # The upgrade is made: the settings are a courtesy.
            logger.warning("Settings of %s not carried into %s: %s", user_id, new_room, e)
        return new_room

    async def _send_tombstone(self, user_id: str, room_id: str, new_room: str) -> str:
        """Send the old room's tombstone naming ``new_room``; its event id."""
        tombstone = EventSpec(
            "m.room.tombstone",
            "",
            user_id,
            {"body": "This room has been replaced", "replacement_room": new_room},
            self._clock.time_msec(),
        )
        [(tombstone_id, _)] = await self._events.send_events(room_id, [tombstone])
        return tombstone_id

    async def _new_room_events(
        self,
        user_id: str,
        old_room: str,
        version: RoomVersion,
        by_key: dict[tuple[str, str | None], Event],
        creation_content: dict[str, Any],
    ) -> list[EventSpec]:
        """The new room's first events, in order, without the create
        event's ``predecessor`` (the caller adds it). ``creation_content``:
        more of the create event's content (``additional_creators``)."""
        now = self._clock.time_msec()

        def state(event_type: str, content: dict[str, Any], key: str = "") -> EventSpec:
            return EventSpec(event_type, key, user_id, content, now)

        old_create = by_key.get(("m.room.create", ""))
        kept = {
            k: v
            for k, v in (old_create.content if old_create else {}).items()
            if k in KEPT_CREATE_CONTENT
        }
        kept.update(creation_content)
        old_version = await self._store.get_room_version(old_room)
        levels_event = by_key.get(("m.room.power_levels", ""))
        levels = integer_levels(levels_event.content if levels_event else {}, old_version)
        users = dict(levels.get("users", {}))
        if version.hashed_room_ids:
            # The new room's creators have unlimited power, never listed.
            creators = {user_id, *creators_of_request(creation_content)}
            users = {u: level for u, level in users.items() if u not in creators}
            levels = {**levels, "users": users}
            lifted = levels
        else:
            # The upgrader sets up the room: lifted to the highest level any
            # of the copied state (or the bans) needs, then put back.
            single = [v for k, v in levels.items() if k in LEVEL_DEFAULTS]
            needed = max([100, *single, *levels.get("events", {}).values()])
            lifted = {**levels, "users": {**users, user_id: max(users.get(user_id, 0), needed)}}
        specs = await self._room_creation.founding_events(user_id, version, kept, lifted, now)
        for event_type in TRANSFERRED_STATE:
            event = by_key.get((event_type, ""))
            if event is None or not event.content:
                continue
            content = event.content
            if event_type == "m.room.join_rules":
                content = join_rules_for(content, version)
            specs.append(state(event_type, content))
        for (event_type, key), event in sorted(by_key.items(), key=lambda kv: str(kv[0])):
            if event_type == "m.room.member" and key is not None and event.membership == "ban":
                specs.append(state("m.room.member", event.content, key))
        if lifted != levels:
            specs.append(state("m.room.power_levels", levels))
        return specs

    @staticmethod
    def _check_new_room(new_room: str, specs: list[EventSpec]) -> None:
        """The new room's events, checked as its writer will check them,
        before anything is written: a copied event the new version refuses
        is left out (and logged) rather than failing the upgrade halfway."""
        state = RoomAuthState(new_room)
        kept: list[EventSpec] = []
        for index, spec in enumerate(specs):
            try:
                state.check(spec)
            except SynapseError as e:
                if index < 3:  # the create event, the join, the power levels
                    raise
                logger.warning("Upgrade to %s: not copying %s (%s)", new_room, spec.type, e.msg)
                continue
            state.apply_spec(spec)
            kept.append(spec)
        specs[:] = kept

    async def _close_old_room(
        self,
        user_id: str,
        room_id: str,
        old: RoomAuthState,
        by_key: dict[tuple[str, str | None], Event],
    ) -> None:
        """Empty the old room's canonical alias (its aliases moved) and
        restrict its power levels, each only if the upgrader may."""
        now = self._clock.time_msec()
        alias_event = by_key.get(("m.room.canonical_alias", ""))
        if alias_event is not None and alias_event.content:
            await self._send_if_allowed(
                room_id, EventSpec("m.room.canonical_alias", "", user_id, {}, now)
            )
        levels_event = by_key.get(("m.room.power_levels", ""))
        if levels_event is None:
            return
        restricted = max(RESTRICTED_LEVEL, old.named_level("users_default", 0) + 1)
        levels = dict(levels_event.content)
        for key in ("events_default", "invite"):
            if old.named_level(key, 0) < restricted:
                levels[key] = restricted
        if levels != levels_event.content:
            await self._send_if_allowed(
                room_id, EventSpec("m.room.power_levels", "", user_id, levels, now)
            )

    async def _send_if_allowed(self, room_id: str, spec: EventSpec) -> None:
        """Send ``spec`` to the old room if the upgrader may. The new room
        exists by now: a refusal (or a writer out of reach) leaves the old
        room as it was, which the spec allows, and is logged."""
        try:
            await self._events.send_events(room_id, [spec])
        except SynapseError as e:
            log = logger.info if e.code == 403 else logger.warning
            log("Upgrade of %s: %s not sent (%s)", room_id, spec.type, e.msg)
