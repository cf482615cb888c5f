"""Persisting events on their room's writer: ``send_events``."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.api.content import check_events
from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.identifiers import check_identifier_text, check_room_id
from synapse_lite.events import EventSpec
from synapse_lite.http.fields import get_bool, get_dict, get_int, get_list, get_str
from synapse_lite.replication.http.calls import InternalCall
from synapse_lite.replication.http.writes import is_local_user

#: Events one internal request may carry (createRoom sends the most).
MAX_EVENTS_PER_REQUEST = 200


def _spec_to_json(spec: EventSpec) -> dict[str, Any]:
    return {
        "type": spec.type,
        "state_key": spec.state_key,
        "sender": spec.sender,
        "content": spec.content,
        "origin_server_ts": spec.origin_server_ts,
        "txn": list(spec.txn_key) if spec.txn_key else None,
        "redacts": spec.redacts,
    }


def _spec_from_json(data: Any, server_name: str) -> EventSpec:
    if not isinstance(data, dict):
        raise SynapseError(400, "each event must be an object", Codes.BAD_JSON)
    sender = get_str(data, "sender")
    if not is_local_user(sender, server_name):
        raise SynapseError(400, "'sender' must be a local user id", Codes.BAD_JSON)
    state_key = data.get("state_key")
    if state_key is not None:
        check_identifier_text(state_key, "state_key")
    content = get_dict(data, "content")
    txn = data.get("txn")
    txn_key = None
    if txn is not None:
        if not (isinstance(txn, list) and len(txn) == 3 and all(isinstance(t, str) for t in txn)):
            raise SynapseError(400, "'txn' must be [user, device, txn_id]", Codes.BAD_JSON)
        if txn[0] != sender:
            raise SynapseError(400, "'txn' must be the sender's", Codes.BAD_JSON)
        txn_key = (txn[0], txn[1], txn[2])
    redacts = data.get("redacts")
    if redacts is not None:
        check_identifier_text(redacts, "redacts")
    return EventSpec(
        type=check_identifier_text(data.get("type"), "type"),
        state_key=state_key,
        sender=sender,
        content=content,
        origin_server_ts=get_int(data, "origin_server_ts"),
        txn_key=txn_key,
        redacts=redacts,
    )


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventsToPersist:
    """Events for one room, in order; ``create_room``: they create it."""

    room_id: str
    specs: list[EventSpec]
    create_room: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "room_id": self.room_id,
            "create_room": self.create_room,
            "events": [_spec_to_json(s) for s in self.specs],
        }

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> EventsToPersist:
        raw_events = get_list(body, "events")
        if not 1 <= len(raw_events) <= MAX_EVENTS_PER_REQUEST:
            raise SynapseError(
                400, f"'events' must hold 1 to {MAX_EVENTS_PER_REQUEST} events", Codes.BAD_JSON
            )
        room_id = check_room_id(get_str(body, "room_id"))
        specs = [_spec_from_json(e, server_name) for e in raw_events]
        check_events(room_id, specs)
        return cls(room_id=room_id, specs=specs, create_room=get_bool(body, "create_room", False))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventsPersisted:
    """``(event_id, stream_ordering)`` of each event, in order."""

    events: list[tuple[str, int]]

    def to_json(self) -> dict[str, Any]:
        return {"events": [[e, s] for e, s in self.events]}

    @classmethod
    def from_json(cls, body: dict[str, Any], server_name: str) -> EventsPersisted:
        events: list[tuple[str, int]] = []
        for item in get_list(body, "events"):
            if not (
                isinstance(item, list)
                and len(item) == 2
                and isinstance(item[0], str)
                and isinstance(item[1], int)
                and not isinstance(item[1], bool)
            ):
                raise SynapseError(400, "each event must be [event_id, position]", Codes.BAD_JSON)
            events.append((item[0], item[1]))
        if not events:
            raise SynapseError(400, "no events in the answer", Codes.BAD_JSON)
        return cls(events)


def _newest_position(answer: EventsPersisted) -> tuple[str, int]:
    return "events", max(position for _, position in answer.events)


SEND_EVENTS = InternalCall(
    "send_events",
    EventsToPersist,
    EventsPersisted,
    answer_position=_newest_position,
)
