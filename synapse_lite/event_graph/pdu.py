"""An event as the room graph sees it: its place in the graph (parents,
auth events, depth) and what authorisation and state resolution read."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.api.room_versions import EventIdFormat, RoomVersion

if TYPE_CHECKING:
    from synapse_lite.events import Event

#: A state key: ``(event type, state key)``.
StateKey = tuple[str, str]


class PduFormatError(ValueError):
    """A server-server event that does not have the shape of its version."""


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Pdu:
    """One event of a room graph. Immutable; compared by all its fields."""

    event_id: str
    room_id: str
    type: str
    state_key: str | None
    sender: str
    content: Mapping[str, Any] = attr.ib(hash=False)
    prev_event_ids: tuple[str, ...]
    auth_event_ids: tuple[str, ...]
    depth: int
    origin_server_ts: int
    #: The event an ``m.room.redaction`` redacts (top level before version
    #: 11, in the content from 11).
    redacts: str | None = None

    @property
    def state_pair(self) -> StateKey | None:
        """``(type, state_key)`` of a state event, None for a message."""
        return None if self.state_key is None else (self.type, self.state_key)

    @property
    def membership(self) -> str | None:
        """The membership of an ``m.room.member`` event (None otherwise, or
        when it is not a string)."""
        if self.type != "m.room.member":
            return None
        value = self.content.get("membership")
        return value if isinstance(value, str) else None

    @classmethod
    def from_json(cls, room_version: RoomVersion, pdu: Mapping[str, Any], event_id: str) -> Pdu:
        """Read an event in the server-server form of ``room_version``,
        whose id is ``event_id`` (given: it is part of the event in
        versions 1 and 2, and a hash computed by
        :func:`~synapse_lite.event_graph.hashing.event_id_of` from 3 on).
        A version 12 create event has no ``room_id``: its room's id is
        derived from its event id. :class:`PduFormatError` for a shape
        the version does not allow."""

        def field(key: str, kind: type | tuple[type, ...]) -> Any:
            value = pdu.get(key)
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
                raise PduFormatError(f"'{key}' is missing or not {kind}")
            return value

        event_type = field("type", str)
        if room_version.hashed_room_ids and event_type == "m.room.create":
            if "room_id" in pdu:
                raise PduFormatError("a version 12 create event has no 'room_id'")
            room_id = room_id_of_create(event_id)
        else:
            room_id = field("room_id", str)
        state_key = pdu.get("state_key")
        if state_key is not None and not isinstance(state_key, str):
            raise PduFormatError("'state_key' is not a string")
        content = field("content", dict)
        redacts = content.get("redacts") if room_version.redacts_in_content else pdu.get("redacts")
        return cls(
            event_id=event_id,
            room_id=room_id,
            type=event_type,
            state_key=state_key,
            sender=field("sender", str),
            content=content,
            prev_event_ids=_event_refs(room_version, field("prev_events", list), "prev_events"),
            auth_event_ids=_event_refs(room_version, field("auth_events", list), "auth_events"),
            depth=field("depth", int),
            origin_server_ts=field("origin_server_ts", int),
            redacts=redacts if isinstance(redacts, str) else None,
        )


def stored_as_pdu(event: Event) -> Pdu:
    """A stored event as the authorisation rules read it (as an auth event
    or in a state: its own edges are not read there)."""
    return Pdu(
        event_id=event.event_id,
        room_id=event.room_id,
        type=event.type,
        state_key=event.state_key,
        sender=event.sender,
        content=event.content,
        prev_event_ids=(),
        auth_event_ids=(),
        depth=event.depth,
        origin_server_ts=event.origin_server_ts,
        redacts=event.redacts,
    )


def room_id_of_create(create_event_id: str) -> str:
    """The room id of a version 12 room: its create event's id with ``!``."""
    return "!" + create_event_id[1:]


def create_event_id_of_room(room_id: str) -> str:
    """The create event's id of a version 12 room: its room id with ``$``."""
    return "$" + room_id[1:]


def _event_refs(room_version: RoomVersion, refs: list[Any], key: str) -> tuple[str, ...]:
    """Event ids of ``prev_events``/``auth_events``: ``[id, hashes]`` pairs
    in versions 1 and 2, ids from 3 on."""
    ids = []
    for ref in refs:
        if room_version.event_ids is EventIdFormat.SERVER_SUFFIXED:
            if not (isinstance(ref, list) and len(ref) == 2 and isinstance(ref[0], str)):
                raise PduFormatError(f"'{key}' entries must be [event id, hashes]")
            ids.append(ref[0])
        else:
            if not isinstance(ref, str):
                raise PduFormatError(f"'{key}' entries must be event ids")
            ids.append(ref)
    return tuple(ids)
