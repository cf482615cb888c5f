"""Persisting an event another server made on its room's writer:
``persist_received_event`` (a remote join accepted by ``send_join``, refused
outright when it breaks the rules) and ``persist_received_pdu`` (a PDU of a
transaction, stored with its outcome)."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.codec.kinds import Identifier, JsonObject, RoomId, wire
from synapse_lite.replication.http.calls import InternalCall
from synapse_lite.replication.http.send_events import SEND_EVENTS, EventsPersisted


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ReceivedEvent:
    """One event of ``room_id`` in its server-server form, as ``origin``
    sent it; the receiving process checked its id, hash and signatures,
    the writer checks it against the room's rules."""

    room_id: str = attr.ib(metadata=wire(RoomId()))
    origin: str = attr.ib(metadata=wire(Identifier()))
    pdu: dict[str, Any] = attr.ib(hash=False, metadata=wire(JsonObject()))


PERSIST_RECEIVED_EVENT = InternalCall(
    "persist_received_event",
    ReceivedEvent,
    EventsPersisted,
    # The writer answers an event it already has with that event.
    idempotent=True,
    # The caller waits for the events stream as a send's caller does.
    answer_position=SEND_EVENTS.answer_position,
)


PERSIST_RECEIVED_PDU = InternalCall(
    "persist_received_pdu",
    ReceivedEvent,
    EventsPersisted,
    # A PDU of a transaction: stored with its outcome (rejected,
    # soft-failed or accepted: ``EventCreationHandler.persist_received_event``);
    # an event the writer already has is answered with it.
    idempotent=True,
    answer_position=SEND_EVENTS.answer_position,
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RemoteJoin:
    """Our user's join to another server's room (``answer``: the
    ``room_version``, the signed join ``event``, and the ``state`` before it
    and its ``auth_chain`` from ``origin``'s send_join answer), or leave from
    it (``answer``: ``room_version``, ``event`` and ``leave: true``), checked
    by the process that made it (``handlers/federation_join.py``)."""

    room_id: str = attr.ib(metadata=wire(RoomId()))
    origin: str = attr.ib(metadata=wire(Identifier()))
    answer: dict[str, Any] = attr.ib(hash=False, metadata=wire(JsonObject()))


PERSIST_REMOTE_JOIN = InternalCall(
    "persist_remote_join",
    RemoteJoin,
    EventsPersisted,
    # The writer answers a join it already has with that event.
    idempotent=True,
    answer_position=SEND_EVENTS.answer_position,
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class BackfilledEvents:
    """History of ``room_id`` that ``origin`` answered ``/backfill`` with
    (``answer``: ``{"pdus": [...]}``): each PDU's format, room, content
    hash and signatures checked by the process that asked
    (``handlers/federation_backfill.py``); the writer checks each against
    its own auth events."""

    room_id: str = attr.ib(metadata=wire(RoomId()))
    origin: str = attr.ib(metadata=wire(Identifier()))
    answer: dict[str, Any] = attr.ib(hash=False, metadata=wire(JsonObject()))


PERSIST_BACKFILLED = InternalCall(
    "persist_backfilled",
    BackfilledEvents,
    EventsPersisted,
    # Events the writer already has are left out of what it stores.
    idempotent=True,
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StateGap:
    """A received event whose parents we do not have, with what ``origin``
    gave for them (``answer``: the event as ``pdu``, the events fetched
    for the gap as ``outliers``, and ``states``, the state after each
    missing parent as ``[[type, state_key, event_id], ...]``), each checked
    by the process that asked (``handlers/state_gaps.py``)."""

    room_id: str = attr.ib(metadata=wire(RoomId()))
    origin: str = attr.ib(metadata=wire(Identifier()))
    answer: dict[str, Any] = attr.ib(hash=False, metadata=wire(JsonObject()))


PERSIST_STATE_GAP = InternalCall(
    "persist_state_gap",
    StateGap,
    EventsPersisted,
    # Events the writer already has are answered as they are.
    idempotent=True,
    answer_position=SEND_EVENTS.answer_position,
)
