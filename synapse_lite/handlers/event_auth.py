"""Event authorisation: may this event be added to its room now?

Checked by the room's events writer, against the room's current state, while
it holds the room's lock (see ``message.py``), so two requests racing for
something only one may do (a join and a ban, two power changes) are decided in
the order they are persisted. The rules are the spec's, simplified for a
server without federation: membership transitions, power levels for state,
invites, kicks and bans, and that only joined members send events.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from synapse_lite.api.errors import AuthError, Codes, NotFoundError, SynapseError
from synapse_lite.api.identifiers import is_valid_user_id
from synapse_lite.events import Event, EventSpec

MEMBERSHIPS = ("join", "invite", "leave", "ban")
HISTORY_VISIBILITIES = ("world_readable", "shared", "invited", "joined")
JOIN_RULES = ("public", "invite")

#: The state every auth decision needs, besides the members involved.
AUTH_STATE_TYPES = (
    "m.room.create",
    "m.room.join_rules",
    "m.room.power_levels",
    "m.room.history_visibility",
    "m.room.guest_access",
)


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def check_power_levels_content(content: dict[str, Any]) -> None:
    """Power levels must be integers (else every later check would guess)."""
    for key, value in content.items():
        if key in ("users", "events", "notifications"):
            if not isinstance(value, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in value.values()
            ):
                raise SynapseError(400, f"'{key}' must map names to integers", Codes.BAD_JSON)
            if key == "users" and not all(is_valid_user_id(u) for u in value):
                raise SynapseError(400, "'users' must map user ids to levels", Codes.BAD_JSON)
        elif isinstance(value, bool) or not isinstance(value, int):
            raise SynapseError(400, f"'{key}' must be an integer", Codes.BAD_JSON)


class RoomAuthState:
    """The parts of a room's current state that decide what is allowed."""

    def __init__(self, room_id: str) -> None:
        self.room_id = room_id
        self.exists = False
        self.creator: str | None = None
        self.join_rule = "invite"
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

    # Power

    def user_level(self, user_id: str) -> int:
        if self.power_levels is None:
            return 100 if user_id == self.creator else 0
        users = self.power_levels.get("users")
        default = _int(self.power_levels.get("users_default"), 0)
        if isinstance(users, dict) and user_id in users:
            return _int(users[user_id], default)
        return default

    def required_level(self, event_type: str, is_state: bool) -> int:
        if self.power_levels is None:
            return 0
        events = self.power_levels.get("events")
        if isinstance(events, dict) and event_type in events:
            return _int(events[event_type], 0)
        if is_state:
            return _int(self.power_levels.get("state_default"), 50)
        return _int(self.power_levels.get("events_default"), 0)

    def named_level(self, name: str, default: int) -> int:
        if self.power_levels is None:
            return 0 if name == "invite" else default
        return _int(self.power_levels.get(name), default)

    # Checking

    def check(self, spec: EventSpec) -> None:
        """Raise if ``spec`` may not be added now (403, or 404 for no room)."""
        if spec.type == "m.room.create" and spec.state_key == "":
            if self.exists:
                raise AuthError(403, "The room already exists")
            return
        if not self.exists:
            raise NotFoundError("Unknown room")
        if spec.type == "m.room.member":
            self._check_membership(spec)
            return
        if self.members.get(spec.sender) != "join":
            raise AuthError(403, f"User {spec.sender} is not in room {self.room_id}")
        needed = self.required_level(spec.type, spec.state_key is not None)
        if self.user_level(spec.sender) < needed:
            raise AuthError(403, f"You need power level {needed} to send {spec.type} events")
        if spec.type == "m.room.power_levels" and spec.state_key == "":
            self._check_power_change(spec)
        elif spec.type == "m.room.join_rules" and spec.content.get("join_rule") not in JOIN_RULES:
            raise SynapseError(400, "Unsupported join_rule", Codes.BAD_JSON)
        elif (
            spec.type == "m.room.history_visibility"
            and spec.content.get("history_visibility") not in HISTORY_VISIBILITIES
        ):
            raise SynapseError(400, "Unknown history_visibility", Codes.BAD_JSON)

    def _check_membership(self, spec: EventSpec) -> None:
        target = spec.state_key
        membership = spec.membership
        if target is None or not is_valid_user_id(target):
            raise SynapseError(400, "The state_key must be a user id", Codes.BAD_JSON)
        if membership not in MEMBERSHIPS:
            raise SynapseError(400, "Unsupported membership", Codes.BAD_JSON)
        sender = spec.sender
        sender_m = self.members.get(sender)
        target_m = self.members.get(target)
        if membership == "join":
            if sender != target:
                raise AuthError(403, "Cannot make another user join")
            if target_m == "ban":
                raise AuthError(403, "You are banned from this room")
            if target in self.guests and self.guest_access != "can_join":
                raise AuthError(403, "Guests may not join this room", Codes.GUEST_ACCESS_FORBIDDEN)
            if self.just_created and sender == self.creator:
                return
            if self.join_rule != "public" and target_m not in ("invite", "join"):
                raise AuthError(403, "You are not invited to this room")
            return
        if sender_m != "join" and not (membership == "leave" and sender == target):
            raise AuthError(403, f"User {sender} is not in room {self.room_id}")
        sender_level = self.user_level(sender)
        if membership == "invite":
            if target_m in ("join", "ban"):
                raise AuthError(
                    403,
                    f"{target} is {'banned from' if target_m == 'ban' else 'already in'} the room",
                )
            if sender_level < self.named_level("invite", 0):
                raise AuthError(403, "You do not have permission to invite")
            return
        if membership == "leave" and sender == target:
            if target_m not in ("join", "invite"):
                raise AuthError(403, f"User {sender} is not in room {self.room_id}")
            return
        if membership == "leave":
            if target_m == "ban":
                needed = self.named_level("ban", 50)
            elif target_m in ("join", "invite"):
                needed = self.named_level("kick", 50)
            else:
                raise AuthError(403, f"{target} is not in the room")
        else:  # ban
            needed = self.named_level("ban", 50)
        if sender_level < needed or sender_level <= self.user_level(target):
            raise AuthError(403, "You do not have permission to do that to this user")

    def _check_power_change(self, spec: EventSpec) -> None:
        check_power_levels_content(spec.content)
        if self.power_levels is None:
            return
        mine = self.user_level(spec.sender)
        old_users = self.power_levels.get("users") or {}
        new_users = spec.content.get("users") or {}
        for user in set(old_users) | set(new_users):
            old, new = old_users.get(user), new_users.get(user)
            if old == new:
                continue
            if (new is not None and new > mine) or (
                old is not None and user != spec.sender and old >= mine
            ):
                raise AuthError(403, "You cannot change power levels above your own")
        for key, new_value in spec.content.items():
            if key in ("users", "events", "notifications"):
                continue
            if self.power_levels.get(key) != new_value and new_value > mine:
                raise AuthError(403, "You cannot change power levels above your own")

    # Applying an accepted event

    def apply(
        self, event_type: str, state_key: str | None, sender: str, content: dict[str, Any]
    ) -> None:
        if state_key is None:
            return
        if event_type == "m.room.create" and state_key == "":
            self.exists = True
            creator = content.get("creator")
            self.creator = creator if isinstance(creator, str) else sender
            self.just_created = True
        elif event_type == "m.room.member":
            membership = content.get("membership")
            if isinstance(membership, str):
                self.members[state_key] = membership
        elif event_type == "m.room.join_rules" and state_key == "":
            rule = content.get("join_rule")
            self.join_rule = rule if isinstance(rule, str) else "invite"
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
