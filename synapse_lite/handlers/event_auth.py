"""Event authorisation: may this event be added to its room now?

Checked by the room's events writer, against the room's current state, while
it holds the room's lock (see ``message.py``), so two requests racing for
something only one may do (a join and a ban, two power changes) are decided in
the order they are persisted. The rules are the spec's authorisation rules of
the room's version (``api/room_versions.py``), for a server without
federation: there is one server, so the rules about signatures, auth events
and ``m.federate`` always hold. Beyond the rules, content the spec gives a
meaning to is validated here (a join rule, a history visibility, a
tombstone), so that a client's mistake is a 400 rather than a room nobody
can use.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from synapse_lite.api.errors import AuthError, Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import is_valid_room_id, is_valid_user_id, server_of
from synapse_lite.api.room_versions import (
    KNOWN_ROOM_VERSIONS,
    RoomVersion,
    room_version_of_create,
)
from synapse_lite.events import Event, EventSpec
from synapse_lite.federation.crypto import CanonicalJsonError, check_canonical

HISTORY_VISIBILITIES = ("world_readable", "shared", "invited", "joined")

#: The state every auth decision needs, besides the members involved.
AUTH_STATE_TYPES = (
    "m.room.create",
    "m.room.join_rules",
    "m.room.power_levels",
    "m.room.history_visibility",
    "m.room.guest_access",
)

#: Power level properties holding one level each, and their defaults when
#: the power levels event leaves them out.
LEVEL_DEFAULTS = {
    "users_default": 0,
    "events_default": 0,
    "state_default": 50,
    "ban": 50,
    "kick": 50,
    "redact": 50,
    "invite": 0,
}
#: Power level properties mapping names to levels.
LEVEL_MAPS = ("users", "events", "notifications")

#: A level written as a string, as room versions 1-9 allow: optional
#: whitespace and sign, base 10 digits.
_STRING_LEVEL = re.compile(r"\s*[+-]?[0-9]+\s*")


def parse_level(value: Any, room_version: RoomVersion) -> int | None:
    """A power level as the room's version reads it: an integer, or (before
    version 10) a string of one; None for anything else."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if (
        isinstance(value, str)
        and not room_version.integer_power_levels
        and _STRING_LEVEL.fullmatch(value)
        and len(value) <= 64
    ):
        return int(value)
    return None


def check_power_levels_content(content: dict[str, Any], room_version: RoomVersion) -> None:
    """400 ``M_BAD_JSON`` unless every level is one the room's version
    reads: the single levels and the values of ``users``, ``events`` and
    ``notifications`` (whose ``users`` keys are user ids). Room versions
    before 10 let the spec's rules accept some of these as they are; we
    refuse them all, since every later check would otherwise have to guess."""
    kind = "an integer" if room_version.integer_power_levels else "an integer (or its string)"
    for key in LEVEL_DEFAULTS:
        if key in content and parse_level(content[key], room_version) is None:
            raise SynapseError(400, f"'{key}' must be {kind}", Codes.BAD_JSON)
    for key in LEVEL_MAPS:
        if key not in content:
            continue
        value = content[key]
        if not isinstance(value, dict) or not all(
            parse_level(v, room_version) is not None for v in value.values()
        ):
            raise SynapseError(400, f"'{key}' must map names to {kind}s", Codes.BAD_JSON)
        if key == "users" and not all(is_valid_user_id(u) for u in value):
            raise SynapseError(400, "'users' must map user ids to levels", Codes.BAD_JSON)


def check_join_rules_content(content: dict[str, Any], room_version: RoomVersion) -> None:
    """A join rule the room's version has; ``allow`` (of the restricted
    rules) a list of conditions, each an object with a string ``type``, and
    a room id for ``m.room_membership`` (unknown types never match)."""
    rule = content.get("join_rule")
    if rule not in room_version.join_rules:
        raise SynapseError(
            400,
            f"Unsupported join_rule in a room of version {room_version.identifier}:"
            f" use one of {', '.join(room_version.join_rules)}",
            Codes.BAD_JSON,
        )
    allow = content.get("allow")
    if allow is None or rule not in room_version.restricted_rules:
        return
    if not isinstance(allow, list) or len(allow) > 100:
        raise SynapseError(400, "'allow' must be a list of conditions", Codes.BAD_JSON)
    for condition in allow:
        if not isinstance(condition, dict) or not isinstance(condition.get("type"), str):
            raise SynapseError(400, "Each 'allow' condition needs a 'type'", Codes.BAD_JSON)
        if condition["type"] == "m.room_membership" and not is_valid_room_id(
            condition.get("room_id")
        ):
            raise SynapseError(
                400, "An m.room_membership condition needs a 'room_id'", Codes.BAD_JSON
            )


def _check_content_format(spec: EventSpec, room_version: RoomVersion) -> None:
    """From version 6, content must be canonical JSON (400 ``M_BAD_JSON``)."""
    if not room_version.strict_canonical_json:
        return
    try:
        check_canonical(spec.content)
    except CanonicalJsonError as e:
        raise SynapseError(
            400, f"Event content is not canonical JSON: {e}", Codes.BAD_JSON
        ) from None


def allowed_rooms(allow: Any) -> list[str]:
    """The rooms whose members a restricted join rule's ``allow`` admits."""
    if not isinstance(allow, list):
        return []
    return [
        c["room_id"]
        for c in allow
        if isinstance(c, dict)
        and c.get("type") == "m.room_membership"
        and isinstance(c.get("room_id"), str)
    ]


#: A version 12 room creator's power level, "infinitely high" in the spec:
#: above any level a power levels event can give (canonical JSON integers
#: are at most 2**53 - 1), and an integer as levels are everywhere here.
CREATOR_LEVEL = 2**53


class RoomAuthState:
    """The parts of a room's current state that decide what is allowed."""

    def __init__(self, room_id: str) -> None:
        self.room_id = room_id
        self.exists = False
        self.room_version: RoomVersion | None = None
        self.creator: str | None = None
        #: The room's creators (``RoomVersion.creators``): in version 12
        #: their power is :data:`CREATOR_LEVEL`, never in ``users``.
        self.creators: frozenset[str] = frozenset()
        self.join_rule = "invite"
        #: The ``allow`` conditions of a restricted join rule.
        self.join_rule_allow: Any = None
        self.history_visibility = "shared"
        self.power_levels: dict[str, Any] | None = None
        self.members: dict[str, str] = {}
        #: ``m.room.guest_access``: guests may join only with ``can_join``.
        self.guest_access = "forbidden"
        #: The guest accounts among the users the batch being checked is
        #: about (filled in by the writer, which looks them up).
        self.guests: frozenset[str] = frozenset()
        #: The create event is in the batch being checked (the creator's
        #: first join needs no invite).
        self.just_created = False

    @classmethod
    def from_events(cls, room_id: str, events: Iterable[Event]) -> RoomAuthState:
        state = cls(room_id)
        for event in events:
            state.apply(event.type, event.state_key, event.sender, event.content)
        state.just_created = False
        return state

    @property
    def version(self) -> RoomVersion:
        """The room's version (only once the room exists)."""
        assert self.room_version is not None, "no create event"
        return self.room_version

    # Power

    def _level(self, value: Any, default: int) -> int:
        if self.room_version is None:
            return default
        level = parse_level(value, self.room_version)
        return default if level is None else level

    def user_level(self, user_id: str) -> int:
        version = self.room_version
        if version is not None and version.hashed_room_ids and user_id in self.creators:
            return CREATOR_LEVEL
        if self.power_levels is None:
            return 100 if user_id == self.creator else 0
        users = self.power_levels.get("users")
        default = self._level(self.power_levels.get("users_default"), 0)
        if isinstance(users, dict) and user_id in users:
            return self._level(users[user_id], default)
        return default

    def required_level(self, event_type: str, is_state: bool) -> int:
        if self.power_levels is None:
            return 0
        events = self.power_levels.get("events")
        if isinstance(events, dict) and event_type in events:
            return self._level(events[event_type], 0)
        if is_state:
            return self._level(self.power_levels.get("state_default"), 50)
        return self._level(self.power_levels.get("events_default"), 0)

    def named_level(self, name: str, default: int) -> int:
        if self.power_levels is None:
            return 0 if name == "invite" else default
        return self._level(self.power_levels.get(name), default)

    def can_invite(self, user_id: str) -> bool:
        """Joined, with the power to invite (what authorises a restricted join)."""
        return self.members.get(user_id) == "join" and self.user_level(user_id) >= self.named_level(
            "invite", 0
        )

    # Checking

    def check(self, spec: EventSpec) -> None:
        """Raise if ``spec`` may not be added now: 403 for what the rules
        forbid, 400 for content the room's version refuses, 404 for no room."""
        if spec.type == "m.room.create" and spec.state_key == "":
            self._check_create(spec)
            return
        if not self.exists:
            raise NotFoundError("Unknown room")
        version = self.version
        _check_content_format(spec, version)
        if spec.type == "m.room.member":
            self._check_membership(spec)
            return
        if spec.type == "m.room.aliases" and version.alias_events_special:
            # Versions 1-5: a server's aliases, published by any of its users.
            if spec.state_key != server_of(spec.sender):
                raise AuthError(403, "The state_key of m.room.aliases must be your server")
            return
        if self.members.get(spec.sender) != "join":
            raise AuthError(403, f"User {spec.sender} is not in room {self.room_id}")
        if spec.type == "m.room.third_party_invite":
            if self.user_level(spec.sender) < self.named_level("invite", 0):
                raise AuthError(403, "You do not have permission to invite")
            return
        needed = self.required_level(spec.type, spec.state_key is not None)
        if self.user_level(spec.sender) < needed:
            raise AuthError(403, f"You need power level {needed} to send {spec.type} events")
        if spec.state_key is not None and spec.state_key.startswith("@"):
            if spec.state_key != spec.sender:
                raise AuthError(403, "A state_key that is a user id must be your own")
        if spec.state_key == "":
            self._check_state_content(spec)

    def _check_create(self, spec: EventSpec) -> None:
        if self.exists:
            raise AuthError(403, "The room already exists")
        version = room_version_of_create(spec.content)
        if version is None or version.identifier not in KNOWN_ROOM_VERSIONS:
            # Rooms are created here only in the versions this server creates.
            raise SynapseError(400, "Unknown room_version", "M_UNSUPPORTED_ROOM_VERSION")
        _check_content_format(spec, version)
        if version.creator_in_create_content and not isinstance(spec.content.get("creator"), str):
            raise SynapseError(400, "m.room.create needs a 'creator'", Codes.BAD_JSON)
        if version.hashed_room_ids:
            additional = spec.content.get("additional_creators", [])
            if not isinstance(additional, list) or not all(is_valid_user_id(u) for u in additional):
                raise SynapseError(
                    400, "'additional_creators' must be a list of user ids", Codes.BAD_JSON
                )
        elif server_of(spec.sender) != server_of(self.room_id):
            # Version 12 room ids name no server: the id is the create event's.
            raise AuthError(403, "Rooms are created by users of their server")

    def _check_state_content(self, spec: EventSpec) -> None:
        """The room-wide state whose content the spec defines."""
        version = self.version
        if spec.type == "m.room.power_levels":
            self._check_power_change(spec)
        elif spec.type == "m.room.join_rules":
            check_join_rules_content(spec.content, version)
        elif (
            spec.type == "m.room.history_visibility"
            and spec.content.get("history_visibility") not in HISTORY_VISIBILITIES
        ):
            raise SynapseError(400, "Unknown history_visibility", Codes.BAD_JSON)
        elif spec.type == "m.room.tombstone":
            replacement = spec.content.get("replacement_room")
            if not is_valid_room_id(replacement):
                raise SynapseError(400, "'replacement_room' must be a room id", Codes.BAD_JSON)
            if replacement == self.room_id:
                raise SynapseError(400, "A tombstone cannot point to its own room", Codes.BAD_JSON)

    def _check_membership(self, spec: EventSpec) -> None:
        version = self.version
        target = spec.state_key
        membership = spec.membership
        if target is None or not is_valid_user_id(target):
            raise SynapseError(400, "The state_key must be a user id", Codes.BAD_JSON)
        if membership not in version.memberships:
            raise SynapseError(
                400,
                f"Unsupported membership in a room of version {version.identifier}",
                Codes.BAD_JSON,
            )
        authoriser = spec.content.get("join_authorised_via_users_server")
        if authoriser is not None and version.restricted_joins:
            # Only this server can vouch for a join (there is no other): the
            # room id's server, or in version 12 (no server in the id) the
            # creator's.
            ours = server_of(self.room_id) or server_of(self.creator or "")
            if not isinstance(authoriser, str) or server_of(authoriser) != ours:
                raise AuthError(403, "join_authorised_via_users_server must be a user of ours")
        sender = spec.sender
        if membership == "join":
            self._check_join(spec, target)
        elif membership == "knock":
            self._check_knock(sender, target)
        elif self.members.get(sender) != "join" and not (
            membership == "leave" and sender == target
        ):
            raise AuthError(403, f"User {sender} is not in room {self.room_id}")
        elif membership == "invite":
            self._check_invite(sender, target)
        elif membership == "leave":
            self._check_leave(sender, target)
        else:  # ban
            sender_level = self.user_level(sender)
            if sender_level < self.named_level("ban", 50) or sender_level <= self.user_level(
                target
            ):
                raise AuthError(403, "You do not have permission to ban this user")

    def _check_join(self, spec: EventSpec, target: str) -> None:
        sender = spec.sender
        if sender != target:
            raise AuthError(403, "Cannot make another user join")
        current = self.members.get(target)
        if current == "ban":
            raise AuthError(403, "You are banned from this room")
        if target in self.guests and self.guest_access != "can_join":
            raise AuthError(403, "Guests may not join this room", Codes.GUEST_ACCESS_FORBIDDEN)
        if self.just_created and sender == self.creator:
            return
        rule = self.join_rule
        if rule == "public" or current in ("invite", "join"):
            return
        if rule in self.version.restricted_rules:
            authoriser = spec.content.get("join_authorised_via_users_server")
            if isinstance(authoriser, str) and self.can_invite(authoriser):
                return
            raise AuthError(
                403, "You are not invited to this room and no member authorised your join"
            )
        if rule in self.version.knock_rules:
            raise AuthError(403, "You are not invited to this room: knock to ask for an invite")
        raise AuthError(403, "You are not invited to this room")

    def _check_knock(self, sender: str, target: str) -> None:
        if self.join_rule not in self.version.knock_rules:
            raise AuthError(403, "This room does not take knocks")
        if sender != target:
            raise AuthError(403, "Cannot knock for another user")
        current = self.members.get(sender)
        if current == "ban":
            raise AuthError(403, "You are banned from this room")
        if current in ("invite", "join"):
            raise AuthError(
                403, f"You are {'already in' if current == 'join' else 'invited to'} this room"
            )

    def _check_invite(self, sender: str, target: str) -> None:
        target_m = self.members.get(target)
        if target_m in ("join", "ban"):
            raise AuthError(
                403, f"{target} is {'banned from' if target_m == 'ban' else 'already in'} the room"
            )
        if self.user_level(sender) < self.named_level("invite", 0):
            raise AuthError(403, "You do not have permission to invite")

    def _check_leave(self, sender: str, target: str) -> None:
        target_m = self.members.get(target)
        if sender == target:
            if target_m not in ("join", "invite", "knock"):
                raise AuthError(403, f"User {sender} is not in room {self.room_id}")
            return
        if target_m not in ("join", "invite", "knock", "ban"):
            # The rules would allow it (a leave changing nothing); a client
            # kicking someone who is not there has made a mistake.
            raise AuthError(403, f"{target} is not in the room")
        sender_level = self.user_level(sender)
        if target_m == "ban" and sender_level < self.named_level("ban", 50):
            raise AuthError(403, "You do not have permission to unban this user")
        if sender_level < self.named_level("kick", 50) or sender_level <= self.user_level(target):
            raise AuthError(403, "You do not have permission to do that to this user")

    def _check_power_change(self, spec: EventSpec) -> None:
        """The spec's rules for power levels: any level changed, added or
        removed must be, before and after, no higher than the sender's (for
        other users' levels, lower than it)."""
        version = self.version
        check_power_levels_content(spec.content, version)
        users = spec.content.get("users")
        if version.hashed_room_ids and isinstance(users, dict) and self.creators & set(users):
            raise AuthError(403, "The room's creators have unlimited power: not in 'users'")
        if self.power_levels is None:
            return
        mine = self.user_level(spec.sender)
        old, new = self.power_levels, spec.content

        def changed(old_map: Any, new_map: Any) -> Iterator[tuple[str, int | None, int | None]]:
            """(name, level before, level after) of each entry changed,
            added or removed between two maps of levels."""
            old_map = old_map if isinstance(old_map, dict) else {}
            new_map = new_map if isinstance(new_map, dict) else {}
            for name in set(old_map) | set(new_map):
                before, after = old_map.get(name), new_map.get(name)
                before = None if before is None else parse_level(before, version)
                after = None if after is None else parse_level(after, version)
                if before != after:
                    yield name, before, after

        def single(levels: dict[str, Any]) -> dict[str, Any]:
            return {k: v for k, v in levels.items() if k in LEVEL_DEFAULTS}

        maps = ["events", "notifications"] if version.notifications_power_levels else ["events"]
        for old_map, new_map in [(single(old), single(new))] + [
            (old.get(k), new.get(k)) for k in maps
        ]:
            for _, before, after in changed(old_map, new_map):
                if (before is not None and before > mine) or (after is not None and after > mine):
                    raise AuthError(403, "You cannot change power levels above your own")
        for user, before, after in changed(old.get("users"), new.get("users")):
            if (before is not None and user != spec.sender and before >= mine) or (
                after is not None and after > mine
            ):
                raise AuthError(
                    403, "You cannot change a user at or above your level, nor raise one above it"
                )

    # Applying an accepted event

    def apply(
        self, event_type: str, state_key: str | None, sender: str, content: dict[str, Any]
    ) -> None:
        if state_key is None:
            return
        if event_type == "m.room.create" and state_key == "":
            self.exists = True
            self.room_version = room_version_of_create(content)
            creator = content.get("creator")
            if self.room_version is not None and self.room_version.creator_in_create_content:
                self.creator = creator if isinstance(creator, str) else sender
            else:
                self.creator = sender
            if self.room_version is not None:
                self.creators = self.room_version.creators(sender, content)
            self.just_created = True
        elif event_type == "m.room.member":
            membership = content.get("membership")
            if isinstance(membership, str):
                self.members[state_key] = membership
        elif event_type == "m.room.join_rules" and state_key == "":
            rule = content.get("join_rule")
            self.join_rule = rule if isinstance(rule, str) else "invite"
            self.join_rule_allow = content.get("allow")
        elif event_type == "m.room.power_levels" and state_key == "":
            self.power_levels = content
        elif event_type == "m.room.history_visibility" and state_key == "":
            value = content.get("history_visibility")
            self.history_visibility = value if isinstance(value, str) else "shared"
        elif event_type == "m.room.guest_access" and state_key == "":
            access = content.get("guest_access")
            self.guest_access = access if isinstance(access, str) else "forbidden"

    def apply_spec(self, spec: EventSpec) -> None:
        self.apply(spec.type, spec.state_key, spec.sender, spec.content)
