"""Persisting an event another server made on its room's writer:
``persist_received_event`` (a remote join accepted by ``send_join``, refused
outright when it breaks the rules), ``persist_remote_join``, and
``process_inbound_pdus`` (the room's writer takes a room's durable inbound
queue of received PDUs now, each stored with its outcome)."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.codec.kinds import Identifier, Int, JsonObject, RoomId, Strings, wire
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
class QueuedPdus:
    """PDUs of ``room_id`` just written to the durable inbound queue: the
    room's writer processes the room's queue now and answers the outcomes
    of ``event_ids`` it knows within a bounded wait."""

    room_id: str = attr.ib(metadata=wire(RoomId()))
    event_ids: list[str] = attr.ib(metadata=wire(Strings()))


@attr.s(slots=True, frozen=True, auto_attribs=True)
class QueuedOutcomes:
    """``outcomes``: event id -> ``{}`` (persisted, accepted or soft-failed)
    or ``{"error": why}`` (rejected, stored; or refused, not stored), for
    those processed in time (the rest stay queued and are processed
    later); ``position``: the newest events stream position they were
    persisted at (0: none)."""

    outcomes: dict[str, Any] = attr.ib(hash=False, metadata=wire(JsonObject()))
    position: int = attr.ib(metadata=wire(Int()))


def _outcomes_position(answer: QueuedOutcomes) -> tuple[str, int] | None:
    return ("events", answer.position) if answer.position else None


PROCESS_INBOUND_PDUS = InternalCall(
    "process_inbound_pdus",
    QueuedPdus,
    QueuedOutcomes,
    # Processing the queue twice is processing it once: what left it stays out.
    idempotent=True,
    # The caller then reads the persisted events as the writer wrote them.
    answer_position=_outcomes_position,
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
