"""Received events on their room's writer: what the storage persists for an
event another server sent, with its outcome (rejected, soft-failed,
accepted, or an outlier).

The caller (federation) has checked the event's format, hashes and
signatures and fetched what it could of its auth and prev events; this
computes the state before it from its prev events' state groups (resolved
where they differ), runs the spec's three authorisation checks (the pure
:func:`~synapse_lite.event_graph.received.received_outcome`) and gives the
:class:`~synapse_lite.events.EventContent` to persist. The writer's
``persist_received_event`` (``handlers/message.py``) holds the room's lock
around it. docs/event-graph.md, "Rejected, soft-failed and outliers".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.api.room_versions import RoomVersion
from synapse_lite.event_graph.hashing import event_id_of
from synapse_lite.event_graph.pdu import Pdu, PduFormatError, StateKey, stored_as_pdu
from synapse_lite.event_graph.received import (
    ReceivedOutcome,
    needed_state_keys,
    received_outcome,
)
from synapse_lite.events import EventContent

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)


def received_pdu(room_version: RoomVersion, pdu: Mapping[str, Any]) -> Pdu:
    """The event of a server-server ``pdu`` of ``room_version``, its id
    computed (versions 3 on) or read (1-2). 400 ``M_BAD_JSON`` for a shape
    the version does not allow."""
    try:
        event_id = event_id_of(room_version, dict(pdu))
        return Pdu.from_json(room_version, pdu, event_id)
    except (KeyError, PduFormatError) as e:
        raise SynapseError(400, f"Malformed event: {e}", Codes.BAD_JSON) from e


async def received_event_content(
    store: GenericWorkerStore,
    room_version: RoomVersion,
    event: Pdu,
    outlier: bool,
    state_before: Mapping[StateKey, str] | None = None,
) -> EventContent:
    """``event`` as the writer persists it, with its outcome. Its room must
    be known (its create event stored). ``outlier``: persist it without
    the state before it (an auth event fetched for another, say): only
    the check against its own auth events is made. ``state_before``: the
    state before it, as the caller resolved it (parents of which another
    server gave the states). Otherwise every prev event must be stored
    with its state (400 naming the others: fetch them, or persist this as
    an outlier)."""
    if event.type == "m.room.create" and event.state_key == "":
        raise SynapseError(
            400, "A received create event belongs to a join, not to a known room", Codes.BAD_JSON
        )
    keys = needed_state_keys(room_version, event)
    before_ids: Mapping[StateKey, str] | None = state_before
    if not outlier and before_ids is None:
        before_ids = await store.get_state_ids_before_received(event.room_id, event.prev_event_ids)
        if before_ids is None or not event.prev_event_ids:
            known = await store.get_state_groups_of_events(event.prev_event_ids)
            unknown = [
                p for p in event.prev_event_ids if known.get(p, (None, None, False))[1] is None
            ]
            raise SynapseError(
                400,
                f"Event {event.event_id}: prev events not stored with their state:"
                f" {', '.join(unknown) or '(none named)'}; fetch them first or persist it"
                " as an outlier",
                Codes.INVALID_PARAM,
            )
    current_ids = await store.get_current_state_ids(event.room_id)
    wanted = set(event.auth_event_ids)
    for ids in (before_ids, current_ids):
        if ids is not None:
            wanted.update(ids[k] for k in keys if k in ids)
    loaded = await store.get_events(sorted(wanted))
    pdus = {i: stored_as_pdu(e) for i, e in loaded.items()}

    def state(ids: Mapping[StateKey, str] | None) -> dict[StateKey, Pdu] | None:
        if ids is None:
            return None
        return {k: pdus[ids[k]] for k in keys if k in ids and ids[k] in pdus}

    outcome = received_outcome(
        room_version,
        event,
        {a: pdus[a] for a in event.auth_event_ids if a in pdus},
        {i for i, e in loaded.items() if e.rejected},
        state(before_ids),
        state(current_ids) if current_ids else None,
    )
    if outcome.accepted and event.redacts is not None:
        # A redaction of another room's event redacts nothing (redactions
        # apply within their room): kept out of the room's timeline, as
        # a soft-failed event (answered {}, as the reference server does).
        target = (await store.get_events_as_stored([event.redacts])).get(event.redacts)
        if target is not None and target.room_id != event.room_id:
            outcome = ReceivedOutcome(soft_failed="it redacts an event of another room")
    if not outcome.accepted:
        logger.info(
            "Received event %s in %s %s: %s",
            event.event_id,
            event.room_id,
            "rejected" if outcome.rejected else "soft-failed",
            outcome.rejected or outcome.soft_failed,
        )
    return attr.evolve(
        pdu_as_content(event),
        rejected_reason=outcome.rejected,
        soft_failed=outcome.soft_failed is not None,
        outlier=outlier,
    )


def pdu_as_content(pdu: Pdu) -> EventContent:
    """A received event as the store persists it (accepted, in the graph)."""
    return EventContent(
        event_id=pdu.event_id,
        room_id=pdu.room_id,
        type=pdu.type,
        state_key=pdu.state_key,
        sender=pdu.sender,
        content=dict(pdu.content),
        origin_server_ts=pdu.origin_server_ts,
        redacts=pdu.redacts,
        prev_event_ids=pdu.prev_event_ids,
        depth=pdu.depth,
        auth_event_ids=pdu.auth_event_ids,
    )
