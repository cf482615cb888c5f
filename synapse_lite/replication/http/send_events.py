"""Persisting events on their room's writer: ``send_events``."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.api.content import check_events
from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.codec.kinds import Bool, Custom, DecodeContext, ListOf, RoomId, wire
from synapse_lite.codec.objects import Nested
from synapse_lite.events import EventSpec
from synapse_lite.http.fields import list_value
from synapse_lite.replication.http.calls import InternalCall

#: Events one internal request may carry (createRoom sends the most).
MAX_EVENTS_PER_REQUEST = 200


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventsToPersist:
    """Events for one room, in order; ``create_room``: they create it."""

    room_id: str = attr.ib(metadata=wire(RoomId()))
    specs: list[EventSpec] = attr.ib(
        metadata=wire(
            ListOf(
                Nested(EventSpec, "each event must be an object"),
                1,
                MAX_EVENTS_PER_REQUEST,
                "events",
            ),
            key="events",
        )
    )
    create_room: bool = attr.ib(metadata=wire(Bool(False)))

    def check_decoded(self) -> None:
        check_events(self.room_id, self.specs)


def _events_from_json(events: Any, context: DecodeContext) -> list[tuple[str, int]]:
    decoded: list[tuple[str, int]] = []
    for item in list_value(events, "events"):
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], int)
            and not isinstance(item[1], bool)
        ):
            raise SynapseError(400, "each event must be [event_id, position]", Codes.BAD_JSON)
        decoded.append((item[0], item[1]))
    if not decoded:
        raise SynapseError(400, "no events in the answer", Codes.BAD_JSON)
    return decoded


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventsPersisted:
    """``(event_id, stream_ordering)`` of each event, in order."""

    events: list[tuple[str, int]] = attr.ib(
        metadata=wire(
            Custom(
                _events_from_json,
                example=lambda context: [("$one", 3), ("$two", 4)],
                encode=lambda events: [[e, s] for e, s in events],
            )
        )
    )


def _newest_position(answer: EventsPersisted) -> tuple[str, int]:
    return "events", max(position for _, position in answer.events)


SEND_EVENTS = InternalCall(
    "send_events",
    EventsToPersist,
    EventsPersisted,
    answer_position=_newest_position,
)
