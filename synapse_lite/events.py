"""Room events: what is stored, replicated and sent to clients."""

from __future__ import annotations

import base64
import os
from typing import Any

import attr


def new_event_id() -> str:
    """A fresh, unguessable event id."""
    return "$" + base64.urlsafe_b64encode(os.urandom(18)).decode("ascii")


#: What a redaction keeps of an event's content, by event type (room version
#: 10's redaction algorithm; every other type keeps nothing).
REDACTION_KEPT_CONTENT: dict[str, tuple[str, ...]] = {
    "m.room.member": ("membership", "join_authorised_via_users_server"),
    "m.room.create": ("creator",),
    "m.room.join_rules": ("join_rule", "allow"),
    "m.room.power_levels": (
        "ban",
        "events",
        "events_default",
        "kick",
        "redact",
        "state_default",
        "users",
        "users_default",
    ),
    "m.room.aliases": ("aliases",),
    "m.room.history_visibility": ("history_visibility",),
}


def pruned_content(event_type: str, content: dict[str, Any]) -> dict[str, Any]:
    """``content`` as a redaction leaves it."""
    kept = REDACTION_KEPT_CONTENT.get(event_type, ())
    return {k: v for k, v in content.items() if k in kept}


def relation_of(content: dict[str, Any]) -> tuple[str, str] | None:
    """``(parent event id, rel_type)`` of an event's ``m.relates_to``, or None
    (a reply without a ``rel_type`` is not a relation)."""
    relates_to = content.get("m.relates_to")
    if not isinstance(relates_to, dict):
        return None
    parent, rel_type = relates_to.get("event_id"), relates_to.get("rel_type")
    if not isinstance(parent, str) or not isinstance(rel_type, str):
        return None
    if not 0 < len(parent) <= 255 or not 0 < len(rel_type) <= 255:
        return None
    return parent, rel_type


class _EventKind:
    """What an event's type and state key say about it (for every stage of an
    event: requested, about to be persisted, persisted)."""

    __slots__ = ()
    type: str
    state_key: str | None
    content: dict[str, Any]

    @property
    def is_state(self) -> bool:
        return self.state_key is not None

    @property
    def membership(self) -> str | None:
        """The membership a member event sets (None for other events)."""
        if self.type == "m.room.member":
            value = self.content.get("membership")
            return value if isinstance(value, str) else None
        return None


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventContent(_EventKind):
    """What a handler asks to persist: an event before it has a stream id."""

    event_id: str
    room_id: str
    type: str
    state_key: str | None
    sender: str
    content: dict[str, Any] = attr.ib(hash=False)
    origin_server_ts: int
    redacts: str | None = None
    #: (user_id, device_id, txn_id) of an idempotent client send.
    txn_key: tuple[str, str, str] | None = None


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Event(_EventKind):
    """A persisted event: its content plus where it sits in the streams."""

    event_id: str
    room_id: str
    type: str
    state_key: str | None
    sender: str
    content: dict[str, Any] = attr.ib(hash=False)
    origin_server_ts: int
    stream_ordering: int
    depth: int
    instance_name: str
    redacts: str | None = None
    outlier: bool = False
    #: The redaction that redacted this event (its content is then pruned).
    redacted_because: Event | None = attr.ib(default=None, hash=False)

    def pruned(self) -> Event:
        """This event with its content pruned as a redaction prunes it, with
        no redaction to name (an erased user's event)."""
        return attr.evolve(self, content=pruned_content(self.type, self.content))

    def redacted(self, redaction: Event) -> Event:
        """This event as ``redaction`` leaves it."""
        return attr.evolve(
            self, content=pruned_content(self.type, self.content), redacted_because=redaction
        )

    def to_client_dict(
        self, now_ms: int | None = None, include_room_id: bool = True
    ) -> dict[str, Any]:
        """The event as the Client-Server API shows it."""
        data: dict[str, Any] = {
            "event_id": self.event_id,
            "type": self.type,
            "sender": self.sender,
            "content": self.content,
            "origin_server_ts": self.origin_server_ts,
            "unsigned": {},
        }
        if include_room_id:
            data["room_id"] = self.room_id
        if self.state_key is not None:
            data["state_key"] = self.state_key
        if self.redacts is not None:
            data["redacts"] = self.redacts
        if now_ms is not None:
            data["unsigned"]["age"] = max(0, now_ms - self.origin_server_ts)
        if self.redacted_because is not None:
            data["unsigned"]["redacted_because"] = self.redacted_because.to_client_dict(
                now_ms, include_room_id=False
            )
        return data


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventSpec(_EventKind):
    """What a client asks to send, before its room's writer gives it an id."""

    type: str
    state_key: str | None
    sender: str
    content: dict[str, Any] = attr.ib(hash=False)
    origin_server_ts: int
    #: (user_id, device_id, txn_id) of an idempotent client send.
    txn_key: tuple[str, str, str] | None = None
    #: The event an ``m.room.redaction`` redacts.
    redacts: str | None = None

    def with_id(self, room_id: str) -> EventContent:
        """The event to persist, with a fresh id (given by the writer)."""
        return EventContent(
            event_id=new_event_id(),
            room_id=room_id,
            type=self.type,
            state_key=self.state_key,
            sender=self.sender,
            content=self.content,
            origin_server_ts=self.origin_server_ts,
            redacts=self.redacts,
            txn_key=self.txn_key,
        )
