"""The spec's authorisation rules of room versions 1 to 12, and which auth
events an event must cite (server-server spec, "Auth events selection";
room versions, "Authorisation rules").

Pure: an event and a state map of plain :class:`Pdu` values in, nothing or
:class:`EventAuthError` out. The caller chooses the state: the event's own
auth events (checked first by :func:`auth_events_state`), the state before
the event, or the current state (soft failure). Signature checks (the
sender's server, the authoriser of a restricted join) happen on receipt,
before this (``hashing.servers_that_must_sign``); a third-party invite's
signed block is checked here, as its rule says.

With no ``m.room.power_levels`` event, ``state_default`` is 50 as
everywhere (the spec's event description once said 0, corrected by
matrix-spec#1479: with 0, any user who joined such a room could send its
first power levels and take it).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from synapse_lite.api.identifiers import is_valid_user_id, server_of
from synapse_lite.api.room_versions import SPEC_ROOM_VERSIONS, RoomVersion
from synapse_lite.event_graph.pdu import Pdu, StateKey, room_id_of_create
from synapse_lite.federation.crypto import SignatureError, verify_signed_json
from synapse_lite.handlers.event_auth import LEVEL_DEFAULTS, parse_level

CREATE: StateKey = ("m.room.create", "")
POWER_LEVELS: StateKey = ("m.room.power_levels", "")
JOIN_RULES: StateKey = ("m.room.join_rules", "")

#: A power level above any a power levels event can give (version 12's
#: room creators).
INFINITE_POWER = float("inf")

#: Power level properties holding one level each, with their defaults when
#: a power levels event leaves them out.
_NAMED_LEVELS = LEVEL_DEFAULTS


def power_level(value: Any, room_version: RoomVersion) -> int | None:
    """A power level as the room's version reads it: an integer; before
    version 10 a string of one; in versions 1-5 (no strict canonical JSON)
    also a finite float, truncated at the decimal point. None otherwise."""
    if isinstance(value, float) and not room_version.strict_canonical_json:
        return int(value) if math.isfinite(value) else None
    return parse_level(value, room_version)


class EventAuthError(Exception):
    """An event the authorisation rules reject; ``reason`` says which rule."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def auth_types_for_event(room_version: RoomVersion, event: Pdu) -> set[StateKey]:
    """The state keys an event's ``auth_events`` are selected from: the
    create event (not in version 12, where the room id names it), the power
    levels, the sender's membership; for a member event the target's
    membership, the join rules (join, invite, knock), the third-party invite
    its ``signed.token`` names, and the member event of a restricted join's
    authoriser (version 8 on)."""
    if event.type == "m.room.create":
        return set()
    keys = {POWER_LEVELS, ("m.room.member", event.sender)}
    if not room_version.hashed_room_ids:
        keys.add(CREATE)
    if event.type == "m.room.member" and event.state_key is not None:
        keys.add(("m.room.member", event.state_key))
        membership = event.membership
        if membership in ("join", "invite", "knock"):
            keys.add(JOIN_RULES)
        invite = event.content.get("third_party_invite")
        if membership == "invite" and isinstance(invite, dict):
            signed = invite.get("signed")
            token = signed.get("token") if isinstance(signed, dict) else None
            if isinstance(token, str):
                keys.add(("m.room.third_party_invite", token))
        authoriser = event.content.get("join_authorised_via_users_server")
        if membership == "join" and room_version.restricted_joins and isinstance(authoriser, str):
            keys.add(("m.room.member", authoriser))
    return keys


def select_auth_event_ids(
    room_version: RoomVersion, event: Pdu, state: Mapping[StateKey, str]
) -> list[str]:
    """The ``auth_events`` a new event cites, given the state before it
    (state key -> event id), sorted for a stable order."""
    keys = auth_types_for_event(room_version, event)
    return sorted(state[key] for key in keys if key in state)


def auth_events_state(
    room_version: RoomVersion,
    event: Pdu,
    auth_events: Iterable[Pdu],
    create: Pdu | None = None,
    rejected: Collection[str] = (),
) -> dict[StateKey, Pdu]:
    """The state map an event's own ``auth_events`` give, checked by the
    rules on auth events (no duplicates, only selected keys, none rejected,
    all of the event's room, a create event among them before version 12).
    In version 12 the create event is not an auth event: pass it as
    ``create`` (the event its room id names); it is added to the map."""
    allowed = auth_types_for_event(room_version, event)
    state: dict[StateKey, Pdu] = {}
    for auth_event in auth_events:
        pair = auth_event.state_pair
        if pair is None or pair not in allowed:
            raise EventAuthError(f"auth event {auth_event.event_id} is not one to select")
        if pair in state:
            raise EventAuthError(f"two auth events for {pair}")
        if auth_event.event_id in rejected:
            raise EventAuthError(f"auth event {auth_event.event_id} was rejected")
        if auth_event.room_id != event.room_id:
            raise EventAuthError(f"auth event {auth_event.event_id} is of another room")
        state[pair] = auth_event
    if room_version.hashed_room_ids and event.type != "m.room.create":
        if create is None:
            raise EventAuthError("no create event for the room id")
        state[CREATE] = create
    elif CREATE not in state and event.type != "m.room.create":
        raise EventAuthError("no create event among the auth events")
    return state


def authorise(room_version: RoomVersion, event: Pdu, state: Mapping[StateKey, Pdu]) -> None:
    """Raise :class:`EventAuthError` unless the rules of ``room_version``
    allow ``event`` against ``state`` (which must hold the room's create
    event, in version 12 too; only the state keys of
    :func:`auth_types_for_event` are read)."""
    if event.type == "m.room.create":
        _check_create(room_version, event)
        return
    create = state.get(CREATE)
    if create is None:
        raise EventAuthError("the room has no create event")
    if room_version.hashed_room_ids and event.room_id != room_id_of_create(create.event_id):
        raise EventAuthError("the room id is not the create event's")
    if create.content.get("m.federate") is False and server_of(event.sender) != server_of(
        create.sender
    ):
        raise EventAuthError("the room does not federate")
    if room_version.alias_events_special and event.type == "m.room.aliases":
        if event.state_key is None or event.state_key != server_of(event.sender):
            raise EventAuthError("m.room.aliases must have the sender's server as state key")
        return
    levels = _PowerLevels(room_version, state)
    if event.type == "m.room.member":
        _check_membership(room_version, event, state, levels)
        return
    if _membership(state, event.sender) != "join":
        raise EventAuthError("the sender is not joined")
    if event.type == "m.room.third_party_invite":
        if levels.of_user(event.sender) < levels.named("invite"):
            raise EventAuthError("the sender may not invite")
        return
    if levels.of_user(event.sender) < levels.required_to_send(event):
        raise EventAuthError(f"the sender's power is too low to send {event.type}")
    if (
        event.state_key is not None
        and event.state_key.startswith("@")
        and event.state_key != event.sender
    ):
        raise EventAuthError("a state key starting with @ must be the sender")
    if event.type == "m.room.power_levels":
        _check_power_levels(room_version, event, state, levels)
    if room_version.redaction_auth_rule and event.type == "m.room.redaction":
        if levels.of_user(event.sender) >= levels.named("redact"):
            return
        if event.redacts is None or server_of(event.redacts) != server_of(event.event_id):
            raise EventAuthError("the sender may not redact events of another server")


def redaction_applies(
    room_version: RoomVersion, redaction: Pdu, target: Pdu, state: Mapping[StateKey, Pdu]
) -> bool:
    """Whether ``redaction`` (accepted into its room) redacts ``target``:
    of the same room, not itself, and (from version 3, where the rules no
    longer compare event id domains: the spec's "Handling redactions")
    sent by a user of the target's sender's server or with the ``redact``
    power level in ``state`` (which holds the room's create event and
    power levels). In versions 1-2 the rules already checked it."""
    if redaction.room_id != target.room_id or redaction.event_id == target.event_id:
        return False
    if room_version.redaction_auth_rule or server_of(redaction.sender) == server_of(target.sender):
        return True
    if CREATE not in state:
        return False
    levels = _PowerLevels(room_version, state)
    return levels.of_user(redaction.sender) >= levels.named("redact")


def creators(room_version: RoomVersion, create: Pdu) -> frozenset[str]:
    """The room's creators: ``content.creator`` (versions 1-10), the
    sender (11), the sender and ``additional_creators`` (12)."""
    return room_version.creators(create.sender, create.content)


def _check_create(room_version: RoomVersion, event: Pdu) -> None:
    if event.prev_event_ids:
        raise EventAuthError("a create event has no prev_events")
    if not room_version.hashed_room_ids and server_of(event.room_id) != server_of(event.sender):
        raise EventAuthError("the room id's server is not the sender's")
    version = event.content.get("room_version", "1")
    if not isinstance(version, str) or version not in SPEC_ROOM_VERSIONS:
        raise EventAuthError(f"unknown room version {version!r}")
    if room_version.creator_in_create_content and "creator" not in event.content:
        raise EventAuthError("a create event names its creator")
    if room_version.hashed_room_ids and "additional_creators" in event.content:
        additional = event.content["additional_creators"]
        if not isinstance(additional, list) or not all(is_valid_user_id(u) for u in additional):
            raise EventAuthError("additional_creators must be a list of user ids")


def _membership(state: Mapping[StateKey, Pdu], user_id: str) -> str:
    member = state.get(("m.room.member", user_id))
    membership = member.membership if member is not None else None
    return membership or "leave"


def _join_rule(state: Mapping[StateKey, Pdu]) -> str:
    join_rules = state.get(JOIN_RULES)
    rule = join_rules.content.get("join_rule") if join_rules is not None else None
    return rule if isinstance(rule, str) else "invite"


class _PowerLevels:
    """The power levels a state says, as the version reads them."""

    def __init__(self, room_version: RoomVersion, state: Mapping[StateKey, Pdu]) -> None:
        self.room_version = room_version
        self.event = state.get(POWER_LEVELS)
        self.content: Mapping[str, Any] = self.event.content if self.event is not None else {}
        create = state[CREATE]
        self.creators = creators(room_version, create)

    def _parse(self, value: Any, default: int) -> int:
        level = power_level(value, self.room_version)
        return default if level is None else level

    def of_user(self, user_id: str) -> float:
        if self.room_version.hashed_room_ids and user_id in self.creators:
            return INFINITE_POWER
        if self.event is None:
            return 100 if user_id in self.creators else 0
        default = self._parse(self.content.get("users_default"), 0)
        users = self.content.get("users")
        if isinstance(users, dict) and user_id in users:
            return self._parse(users[user_id], default)
        return default

    def named(self, name: str) -> int:
        return self._parse(self.content.get(name), _NAMED_LEVELS[name])

    def required_to_send(self, event: Pdu) -> int:
        events = self.content.get("events")
        if isinstance(events, dict) and event.type in events:
            return self._parse(events[event.type], 0)
        if event.state_key is not None:
            return self.named("state_default")
        return self.named("events_default")


def _check_membership(
    room_version: RoomVersion, event: Pdu, state: Mapping[StateKey, Pdu], levels: _PowerLevels
) -> None:
    target = event.state_key
    if target is None or "membership" not in event.content:
        raise EventAuthError("a member event needs a state key and a membership")
    membership = event.membership
    sender_membership = _membership(state, event.sender)
    target_membership = _membership(state, target)
    sender_level = levels.of_user(event.sender)
    join_rule = _join_rule(state)
    if membership == "join":
        create = state[CREATE]
        if event.prev_event_ids == (create.event_id,) and target == _first_creator(
            room_version, create
        ):
            return
        if event.sender != target:
            raise EventAuthError("users join only themselves")
        if sender_membership == "ban":
            raise EventAuthError("the sender is banned")
        invite_rules = ("invite", "knock") if room_version.knocking else ("invite",)
        if join_rule in invite_rules:
            if sender_membership not in ("invite", "join"):
                raise EventAuthError("the room is invite only")
            return
        if join_rule in room_version.restricted_rules:
            if sender_membership in ("invite", "join"):
                return
            authoriser = event.content.get("join_authorised_via_users_server")
            if not isinstance(authoriser, str) or _membership(state, authoriser) != "join":
                raise EventAuthError("a restricted join needs a joined authoriser")
            if levels.of_user(authoriser) < levels.named("invite"):
                raise EventAuthError("the authoriser may not invite")
            return
        if join_rule != "public":
            raise EventAuthError(f"join rule {join_rule!r} admits no join")
        return
    if membership == "invite":
        if "third_party_invite" in event.content:
            if target_membership == "ban":
                raise EventAuthError("the target is banned")
            _check_third_party_invite(event, state)
            return
        if sender_membership != "join":
            raise EventAuthError("the sender is not joined")
        if target_membership in ("join", "ban"):
            raise EventAuthError(f"the target's membership is {target_membership}")
        if sender_level < levels.named("invite"):
            raise EventAuthError("the sender may not invite")
        return
    if membership == "leave":
        if event.sender == target:
            leavable = ("invite", "join", "knock") if room_version.knocking else ("invite", "join")
            if sender_membership not in leavable:
                raise EventAuthError(f"cannot leave from {sender_membership}")
            return
        if sender_membership != "join":
            raise EventAuthError("the sender is not joined")
        if target_membership == "ban" and sender_level < levels.named("ban"):
            raise EventAuthError("the sender may not unban")
        if sender_level < levels.named("kick") or levels.of_user(target) >= sender_level:
            raise EventAuthError("the sender may not kick the target")
        return
    if membership == "ban":
        if sender_membership != "join":
            raise EventAuthError("the sender is not joined")
        if sender_level < levels.named("ban") or levels.of_user(target) >= sender_level:
            raise EventAuthError("the sender may not ban the target")
        return
    if membership == "knock" and room_version.knocking:
        if join_rule not in room_version.knock_rules:
            raise EventAuthError(f"join rule {join_rule!r} admits no knock")
        if event.sender != target:
            raise EventAuthError("users knock only for themselves")
        if sender_membership in ("ban", "invite", "join"):
            raise EventAuthError(f"cannot knock from {sender_membership}")
        return
    raise EventAuthError(f"unknown membership {membership!r}")


def _first_creator(room_version: RoomVersion, create: Pdu) -> str | None:
    """Whose join may directly follow the create event: the creator
    (``content.creator`` before version 11, the sender from 11)."""
    if room_version.creator_in_create_content:
        creator = create.content.get("creator")
        return creator if isinstance(creator, str) else None
    return create.sender


def _check_third_party_invite(event: Pdu, state: Mapping[StateKey, Pdu]) -> None:
    invite = event.content["third_party_invite"]
    signed = invite.get("signed") if isinstance(invite, dict) else None
    if not isinstance(signed, dict):
        raise EventAuthError("third_party_invite has no signed block")
    mxid, token = signed.get("mxid"), signed.get("token")
    if not isinstance(mxid, str) or not isinstance(token, str):
        raise EventAuthError("the signed block needs mxid and token")
    if mxid != event.state_key:
        raise EventAuthError("the signed mxid is not the target")
    third_party = state.get(("m.room.third_party_invite", token))
    if third_party is None:
        raise EventAuthError("no third-party invite with that token")
    if third_party.sender != event.sender:
        raise EventAuthError("the third-party invite is another sender's")
    keys = [third_party.content.get("public_key")]
    extra = third_party.content.get("public_keys")
    if isinstance(extra, list):
        keys += [k.get("public_key") for k in extra if isinstance(k, dict)]
    signatures = signed.get("signatures")
    for server, by_key in signatures.items() if isinstance(signatures, dict) else ():
        for key_id in by_key if isinstance(by_key, dict) else ():
            for key in keys:
                if not isinstance(key, str):
                    continue
                standard = key.replace("-", "+").replace("_", "/")
                try:
                    verify_signed_json(signed, server, key_id, standard)
                except SignatureError:
                    continue
                return
    raise EventAuthError("no signature of the third-party invite's keys")


def _check_power_levels(
    room_version: RoomVersion, event: Pdu, state: Mapping[StateKey, Pdu], levels: _PowerLevels
) -> None:
    content = event.content

    def level(value: Any) -> int | None:
        return power_level(value, room_version)

    maps = ("events", "notifications") if room_version.notifications_power_levels else ("events",)
    if room_version.integer_power_levels:
        for name in _NAMED_LEVELS:
            if name in content and level(content[name]) is None:
                raise EventAuthError(f"power level {name!r} is not an integer")
        for name in maps:
            if name in content and not (
                isinstance(content[name], dict)
                and all(level(v) is not None for v in content[name].values())
            ):
                raise EventAuthError(f"{name!r} must map to integers")
    users = content.get("users", {})
    if not isinstance(users, dict) or not all(
        is_valid_user_id(u) and level(v) is not None for u, v in users.items()
    ):
        raise EventAuthError("'users' must map user ids to integers")
    if room_version.hashed_room_ids and levels.creators & set(users):
        raise EventAuthError("the room's creators cannot be given a power level")
    if levels.event is None:
        return
    old = levels.content
    sender_level = levels.of_user(event.sender)
    for name in _NAMED_LEVELS:
        before, after = level(old.get(name)), level(content.get(name))
        if before != after and (
            (before is not None and before > sender_level)
            or (after is not None and after > sender_level)
        ):
            raise EventAuthError(f"the sender may not change {name!r}")
    for name in maps:
        _check_level_map(name, old.get(name), content.get(name), sender_level, level, None)
    _check_level_map("users", old.get("users"), users, sender_level, level, event.sender)


def _check_level_map(
    name: str,
    before_map: Any,
    after_map: Any,
    sender_level: float,
    level: Any,
    sender: str | None,
) -> None:
    """Rules 10.4-10.7: a map of levels (``events``, ``notifications``,
    ``users``; ``sender`` set for ``users``, whose own entry may lower)."""
    before = {k: level(v) for k, v in before_map.items()} if isinstance(before_map, dict) else {}
    after = {k: level(v) for k, v in after_map.items()} if isinstance(after_map, dict) else {}
    for key in before.keys() | after.keys():
        old, new = before.get(key), after.get(key)
        if old == new:
            continue
        if old is not None and key != sender:
            if (old >= sender_level) if sender is not None else (old > sender_level):
                raise EventAuthError(f"the sender may not change {name}[{key!r}]")
        if new is not None and new > sender_level:
            raise EventAuthError(f"the sender may not raise {name}[{key!r}] above its own")
