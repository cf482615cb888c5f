"""Room events: what is stored, replicated and sent to clients."""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Sequence
from typing import Any

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.room_versions import EventIdFormat, RoomVersion
from synapse_lite.codec.kinds import (
    Custom,
    DecodeContext,
    Identifier,
    Int,
    JsonObject,
    LocalUserId,
    Nullable,
    wire,
)
from synapse_lite.federation.crypto import canonical_json, compact_sorted_json, encode_base64


def random_event_id(server_name: str) -> str:
    """An event id of room versions 1 and 2: random, with the server's name."""
    return f"${base64.urlsafe_b64encode(os.urandom(18)).decode('ascii')}:{server_name}"


def reference_hash_event_id(room_version: RoomVersion, pdu: dict[str, Any]) -> str:
    """The event id of room versions 3 on: ``$`` and the event's reference
    hash (the server-server spec's: SHA-256 of the canonical JSON of the
    redacted event, with its content hash under ``hashes``), in the
    version's base64 alphabet. ``pdu``: the event as its room's writer
    builds it, without ``hashes``."""
    hashed = {**pdu, "hashes": content_hashes(room_version, pdu)}
    # The redacted event is made of what the content hash just checked (and
    # the hash itself): encoded without a second check.
    reference = hashlib.sha256(
        compact_sorted_json(pruned_event(room_version, hashed)).encode("utf-8")
    ).digest()
    if room_version.event_ids is EventIdFormat.REFERENCE_HASH_BASE64:
        return "$" + encode_base64(reference)
    return "$" + base64.urlsafe_b64encode(reference).decode("ascii").rstrip("=")


def content_hashes(room_version: RoomVersion, pdu: dict[str, Any]) -> dict[str, str]:
    """The ``hashes`` of an event (server-server form): SHA-256 of the
    canonical JSON of ``pdu`` without ``unsigned``, ``signatures`` and
    ``hashes``, in unpadded base64."""
    unhashed = {k: v for k, v in pdu.items() if k not in ("unsigned", "signatures", "hashes")}
    digest = hashlib.sha256(
        event_canonical_json(unhashed, room_version.strict_canonical_json)
    ).digest()
    return {"sha256": encode_base64(digest)}


def event_canonical_json(pdu: dict[str, Any], strict: bool) -> bytes:
    """Canonical JSON of an event; before version 6 floats were not refused,
    so they are encoded as JSON encodes them."""
    if strict:
        return canonical_json(pdu)
    return compact_sorted_json(pdu).encode("utf-8")


#: Top-level keys of an event (server-server form) a redaction keeps: room
#: versions 1-10, then 11 (which drops ``origin``, ``membership`` and
#: ``prev_state``).
_KEPT_EVENT_KEYS = frozenset(
    (
        "event_id", "type", "room_id", "sender", "state_key", "content", "hashes",
        "signatures", "depth", "prev_events", "auth_events", "origin_server_ts",
    )
)  # fmt: skip
_KEPT_EVENT_KEYS_BEFORE_V11 = _KEPT_EVENT_KEYS | {"origin", "membership", "prev_state"}

#: Content keys a redaction keeps, by event type, in room version 1; every
#: other type keeps nothing. :func:`kept_content_keys` applies what later
#: versions changed.
_KEPT_CONTENT_V1: dict[str, tuple[str, ...]] = {
    "m.room.member": ("membership",),
    "m.room.create": ("creator",),
    "m.room.join_rules": ("join_rule",),
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


def kept_content_keys(event_type: str, room_version: RoomVersion) -> tuple[str, ...] | None:
    """The content keys a redaction keeps of an event of ``event_type`` in a
    room of ``room_version`` (None: all of them)."""
    if room_version.updated_redaction_rules and event_type == "m.room.create":
        return None
    kept = _KEPT_CONTENT_V1.get(event_type, ())
    if event_type == "m.room.aliases" and not room_version.alias_events_special:
        return ()
    if event_type == "m.room.join_rules" and room_version.restricted_joins:
        kept += ("allow",)
    if event_type == "m.room.member" and room_version.redaction_keeps_join_authoriser:
        kept += ("join_authorised_via_users_server",)
    if room_version.updated_redaction_rules:
        if event_type == "m.room.power_levels":
            kept += ("invite",)
        elif event_type == "m.room.redaction":
            kept += ("redacts",)
    return kept


def pruned_content(
    event_type: str, content: dict[str, Any], room_version: RoomVersion
) -> dict[str, Any]:
    """``content`` as the redaction algorithm of ``room_version`` leaves it;
    TypeError when it is not an object (a malformed event another server
    sent: every caller of the event id and hash functions refuses on it)."""
    if not isinstance(content, dict):
        raise TypeError(f"an event's content must be an object, not {type(content).__name__}")
    kept = kept_content_keys(event_type, room_version)
    if kept is None:
        return dict(content)
    pruned = {k: v for k, v in content.items() if k in kept}
    if room_version.updated_redaction_rules and event_type == "m.room.member":
        # Version 11 keeps a third-party invite's signature, and only it.
        invite = content.get("third_party_invite")
        if isinstance(invite, dict) and "signed" in invite:
            pruned["third_party_invite"] = {"signed": invite["signed"]}
    return pruned


def pruned_event(room_version: RoomVersion, pdu: dict[str, Any]) -> dict[str, Any]:
    """An event (server-server form) as the redaction algorithm leaves it."""
    kept = _KEPT_EVENT_KEYS if room_version.updated_redaction_rules else _KEPT_EVENT_KEYS_BEFORE_V11
    pruned = {k: v for k, v in pdu.items() if k in kept}
    pruned["content"] = pruned_content(pdu["type"], pdu.get("content", {}), room_version)
    return pruned


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


def event_pdu(
    room_version: RoomVersion,
    event_id: str | None,
    *,
    room_id: str,
    kind: _EventKind,
    sender: str,
    content: dict[str, Any],
    origin_server_ts: int,
    depth: int,
    prev_event_ids: Sequence[str],
    auth_event_ids: Sequence[str],
    redacts: str | None,
) -> dict[str, Any]:
    """An event in the server-server form this server gives it, without
    ``hashes`` and ``signatures``: what a room's writer hashes into the
    event id from version 3 (so the id is the reference hash of the result,
    hashes added), and what ``event_format: federation`` serves.

    ``prev_event_ids``: the room's forward extremities when the event was
    made (docs/event-graph.md); ``auth_event_ids``: the events the spec's
    auth event selection picks from the state before it (none for events
    persisted before the rooms became graphs, whose ids hash none).
    Versions 1 and 2 name ``event_id`` in the event and pair each previous
    and auth event with its hashes, which we do not keep (an empty object);
    ``origin`` is not set (the sender's server is ours). A version 12
    create event has no ``room_id``: the room id is made from its id.
    """
    prev_events: list[Any] = list(prev_event_ids)
    auth_events: list[Any] = list(auth_event_ids)
    pdu: dict[str, Any] = {
        "type": kind.type,
        "sender": sender,
        "content": content,
        "origin_server_ts": origin_server_ts,
        "depth": depth,
        "prev_events": prev_events,
        "auth_events": auth_events,
    }
    if not (room_version.hashed_room_ids and kind.type == "m.room.create" and kind.state_key == ""):
        pdu["room_id"] = room_id
    if room_version.event_ids is EventIdFormat.SERVER_SUFFIXED:
        pdu["event_id"] = event_id
        pdu["prev_events"] = [[e, {}] for e in prev_events]
        pdu["auth_events"] = [[e, {}] for e in auth_events]
    if kind.state_key is not None:
        pdu["state_key"] = kind.state_key
    if redacts is not None and not room_version.redacts_in_content:
        pdu["redacts"] = redacts
    return pdu


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
    #: Its place in the room's graph: its parents (the room's forward
    #: extremities when it was made), 1 + the deepest parent's depth, and
    #: the events that authorise it.
    prev_event_ids: tuple[str, ...] = ()
    depth: int = 1
    auth_event_ids: tuple[str, ...] = ()
    #: A received event's outcome (docs/event-graph.md, "Rejected,
    #: soft-failed and outliers"); a local event is none of these. Why it
    #: was rejected (the rule it broke), else None.
    rejected_reason: str | None = None
    #: Allowed by its auth events and the state before it, refused against
    #: the room's current state.
    soft_failed: bool = False
    #: Known without the state before it (no state groups).
    outlier: bool = False

    @property
    def in_room(self) -> bool:
        """Whether it belongs to the room as clients and new events see it:
        in the current state (if state), an extremity, served."""
        return self.rejected_reason is None and not self.soft_failed and not self.outlier


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
    #: Refused by the authorisation rules against its auth events or the
    #: state before it: stored, never in state or served.
    rejected: bool = False
    #: Refused against the room's current state only: in the graph, never
    #: served.
    soft_failed: bool = False
    #: The redaction that redacted this event (its content is then pruned).
    redacted_because: Event | None = attr.ib(default=None, hash=False)

    @property
    def served(self) -> bool:
        """Whether clients may be given it (timelines, /event, /context,
        relations, search, notifications): not rejected, soft-failed or an
        outlier."""
        return not (self.rejected or self.soft_failed or self.outlier)

    def pruned(self, room_version: RoomVersion) -> Event:
        """This event with its content pruned as a redaction prunes it (by
        the redaction algorithm of its room's version), with no redaction to
        name (an erased user's event)."""
        return attr.evolve(self, content=pruned_content(self.type, self.content, room_version))

    def redacted(self, redaction: Event, room_version: RoomVersion) -> Event:
        """This event as ``redaction`` leaves it, by the redaction algorithm
        of its room's version (which keeps a redaction's top-level
        ``redacts`` only from version 11, where its content keeps it too)."""
        return attr.evolve(
            self,
            content=pruned_content(self.type, self.content, room_version),
            redacts=self.redacts if room_version.updated_redaction_rules else None,
            redacted_because=redaction,
        )

    def to_pdu(
        self,
        room_version: RoomVersion,
        prev_event_ids: Sequence[str],
        auth_event_ids: Sequence[str],
    ) -> dict[str, Any]:
        """The event as :func:`event_pdu` gives it (with its stored
        ``prev_events`` and ``auth_events``)."""
        return event_pdu(
            room_version,
            self.event_id,
            room_id=self.room_id,
            kind=self,
            sender=self.sender,
            content=self.content,
            origin_server_ts=self.origin_server_ts,
            depth=self.depth,
            prev_event_ids=prev_event_ids,
            auth_event_ids=auth_event_ids,
            redacts=self.redacts,
        )

    def to_client_dict(
        self, now_ms: int | None = None, include_room_id: bool = True
    ) -> dict[str, Any]:
        """The event as the Client-Server API shows it."""
        content = self.content
        if self.redacts is not None and "redacts" not in content:
            # Room versions before 11 name the redacted event at the top
            # level only; clients written for 11 read it from the content,
            # so it is served in both places in every version (as the
            # spec's version 11 asks of servers).
            content = {**content, "redacts": self.redacts}
        data: dict[str, Any] = {
            "event_id": self.event_id,
            "type": self.type,
            "sender": self.sender,
            "content": content,
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
            # The id alone too, as the reference server gives it (SyTest reads it).
            data["unsigned"]["redacted_by"] = self.redacted_because.event_id
        return data


def _decode_txn_key(txn: Any, context: DecodeContext) -> tuple[str, str, str] | None:
    if txn is None:
        return None
    if not (isinstance(txn, list) and len(txn) == 3 and all(isinstance(t, str) for t in txn)):
        raise SynapseError(400, "'txn' must be [user, device, txn_id]", Codes.BAD_JSON)
    return (txn[0], txn[1], txn[2])


_TXN_KEY = Custom(
    _decode_txn_key,
    example=lambda context: (f"@alice:{context.local_server()}", "DEV", "txn1"),
    encode=lambda txn_key: None if txn_key is None else list(txn_key),
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class EventSpec(_EventKind):
    """What a client asks to send, before its room's writer gives it an id.

    Its fields' kinds are how it travels to the room's writer
    (``replication/http/send_events.py``)."""

    type: str = attr.ib(metadata=wire(Identifier()))
    state_key: str | None = attr.ib(metadata=wire(Nullable(Identifier())))
    sender: str = attr.ib(metadata=wire(LocalUserId()))
    content: dict[str, Any] = attr.ib(hash=False, metadata=wire(JsonObject()))
    origin_server_ts: int = attr.ib(metadata=wire(Int()))
    #: (user_id, device_id, txn_id) of an idempotent client send.
    txn_key: tuple[str, str, str] | None = attr.ib(default=None, metadata=wire(_TXN_KEY, key="txn"))
    #: The event an ``m.room.redaction`` redacts.
    redacts: str | None = attr.ib(default=None, metadata=wire(Nullable(Identifier())))

    def check_decoded(self) -> None:
        if self.txn_key is not None and self.txn_key[0] != self.sender:
            raise SynapseError(400, "'txn' must be the sender's", Codes.BAD_JSON)

    def to_persist(
        self,
        room_id: str,
        room_version: RoomVersion,
        server_name: str,
        prev_event_ids: Sequence[str],
        depth: int,
        auth_event_ids: Sequence[str] = (),
    ) -> EventContent:
        """The event to persist, in the shape and with the id its room's
        version gives it. Made by the room's writer, which knows the room's
        forward extremities (``prev_event_ids``, none before the create
        event), the ``depth`` this event will have and its auth events:
        with the rest of the event they make the reference hash of versions
        3 on, so no two events of a room share an id."""
        content = self.content
        if self.redacts is not None and room_version.redacts_in_content:
            content = {**content, "redacts": self.redacts}
        if room_version.event_ids is EventIdFormat.SERVER_SUFFIXED:
            event_id = random_event_id(server_name)
        else:
            pdu = event_pdu(
                room_version,
                None,
                room_id=room_id,
                kind=self,
                sender=self.sender,
                content=content,
                origin_server_ts=self.origin_server_ts,
                depth=depth,
                prev_event_ids=prev_event_ids,
                auth_event_ids=auth_event_ids,
                redacts=self.redacts,
            )
            event_id = reference_hash_event_id(room_version, pdu)
        return EventContent(
            event_id=event_id,
            room_id=room_id,
            type=self.type,
            state_key=self.state_key,
            sender=self.sender,
            content=content,
            origin_server_ts=self.origin_server_ts,
            redacts=self.redacts,
            txn_key=self.txn_key,
            prev_event_ids=tuple(prev_event_ids),
            depth=depth,
            auth_event_ids=tuple(auth_event_ids),
        )
