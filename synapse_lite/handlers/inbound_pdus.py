"""The PDUs of a transaction another server sent (``PUT /send/{txnId}``):
each checked as untrusted input and, when it passes, persisted by its room's
writer with its outcome (docs/federation.md, "Inbound").

For each PDU, in this order, anything failing answers that PDU with an
``error`` and stores nothing of it (the other PDUs go on):

1. its room is one we have (its version decides the format);
2. the format, size and content hash checks (``federation/pdu_checks.py``;
   a hash mismatch keeps the redacted form, as the spec says);
3. the room's server ACL allows the origin, and the origin has a user
   joined to the room now, or the event is the membership of one of the
   origin's own users (a server joining its user directly);
4. the servers that must sign it did (keys from the keyring);
5. its ``prev_events`` are stored (in the graph, not outliers); when some
   are not, up to :data:`MISSING_EVENTS_LIMIT` missing ancestors are asked
   of the origin with ``/get_missing_events`` (each checked as in 2 and 4
   and persisted oldest first); if that does not close the gap the PDU is
   answered with an error and nothing is stored (decided: it is not kept
   as an outlier, which would stay one: docs/federation.md);
6. the room's writer persists it through the internal call
   ``persist_received_pdu`` (:meth:`EventCreationHandler.persist_received_event`:
   the spec's three authorisation checks, rejected / soft-failed /
   accepted). A rejected event is stored and answered with an error
   naming the rule; a soft-failed one is stored and answered ``{}``.

An event already stored is answered ``{}`` (a PDU sent twice is
idempotent). An unexpected failure on one PDU is logged and answered as its
error; the other PDUs go on. The PDUs are handled one at a time, shallowest first, so an
event's parents in the same transaction come before it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import SynapseError
from synapse_lite.api.identifiers import server_of
from synapse_lite.api.room_versions import RoomVersion
from synapse_lite.federation.client import FederationRequestError
from synapse_lite.federation.pdu_checks import (
    CheckedPdu,
    PduRefused,
    check_pdu_format,
    check_pdu_signatures,
)
from synapse_lite.federation.server_acl import room_allows_server
from synapse_lite.handlers.state_gaps import StateGaps
from synapse_lite.replication.http.federation_rooms import PERSIST_RECEIVED_PDU, ReceivedEvent
from synapse_lite.replication.http.send_events import EventsPersisted

if TYPE_CHECKING:
    from synapse_lite.federation.client import FederationClient
    from synapse_lite.federation.keyring import Keyring
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Missing ancestors asked of the origin per PDU (the spec suggests 10).
MISSING_EVENTS_LIMIT = 10
#: Gaps filled with ``/state_ids`` per PDU (``handlers/state_gaps.py``).
MAX_GAPS_FILLED = 1


class PduError(Exception):
    """One PDU's answer in the transaction: ``{"error": str(e)}``, under
    ``event_id`` when it is known (else the id the PDU claims)."""

    def __init__(self, message: str, event_id: str | None = None) -> None:
        super().__init__(message)
        self.event_id = event_id


class InboundPdus:
    """Checks and persists the PDUs of received transactions (any process
    with the ``federation`` resource; the room's writer persists)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        server_name: str,
        keyring: Keyring,
        client: FederationClient,
        calls: InternalCalls,
        event_writers: Callable[[], Sequence[str]],
    ) -> None:
        self._store = store
        self._server_name = server_name
        self._keyring = keyring
        self._client = client
        self._calls = calls
        self._event_writers = event_writers
        self._gaps = StateGaps(
            store=store, keyring=keyring, client=client, calls=calls, event_writers=event_writers
        )

    async def on_pdus(self, origin: str, pdus: Sequence[Any]) -> dict[str, dict[str, str]]:
        """The ``pdus`` answer of a transaction from ``origin``: each PDU's
        id -> ``{}`` or ``{"error": why}``. A PDU whose id cannot be known
        (not an object, no known room and no ``event_id``) is logged and
        left out."""
        results: dict[str, dict[str, str]] = {}
        checked: list[tuple[RoomVersion, CheckedPdu]] = []
        for raw in pdus:
            try:
                version, pdu = await self._check(origin, raw)
            except PduError as e:
                key = e.event_id or _claimed_id(raw)
                logger.info("Refused PDU %s from %s: %s", key or "(no id)", origin, e)
                if key is not None:
                    results[key] = {"error": str(e)}
                continue
            except Exception:
                # One PDU that breaks something here must not cost the
                # others (nor make the origin retry the whole transaction).
                key = _claimed_id(raw)
                logger.exception("Checking PDU %s from %s failed", key or "(no id)", origin)
                if key is not None:
                    results[key] = {"error": "it could not be processed here"}
                continue
            checked.append((version, pdu))
        checked.sort(key=lambda c: c[1].event.depth)
        for version, pdu in checked:
            try:
                await self._persist_with_parents(origin, version, pdu)
                results[pdu.event_id] = {}
            except PduError as e:
                logger.info("Refused PDU %s from %s: %s", pdu.event_id, origin, e)
                results[pdu.event_id] = {"error": str(e)}
            except Exception:
                logger.exception("Persisting PDU %s from %s failed", pdu.event_id, origin)
                results[pdu.event_id] = {"error": "it could not be processed here"}
        return results

    async def _check(self, origin: str, raw: Any) -> tuple[RoomVersion, CheckedPdu]:
        """Steps 1-4 of the module docstring."""
        room_id = raw.get("room_id") if isinstance(raw, dict) else None
        if not isinstance(room_id, str) or await self._store.get_room(room_id) is None:
            raise PduError(f"room {room_id!r} is not known here")
        version = await self._store.get_room_version(room_id)
        try:
            pdu = check_pdu_format(version, raw)
        except PduRefused as e:
            raise PduError(str(e)) from None
        if not await room_allows_server(self._store, room_id, origin):
            raise PduError(f"{origin} is denied by the room's server ACL", pdu.event_id)
        event = pdu.event
        own_membership = event.type == "m.room.member" and (
            event.state_key is not None and server_of(event.state_key) == origin
        )
        if not own_membership and not any(
            server_of(u) == origin for u in await self._store.get_users_in_room(room_id)
        ):
            raise PduError(f"{origin} has no user in room {room_id}", pdu.event_id)
        try:
            await check_pdu_signatures(self._keyring, version, pdu.pdu)
        except PduRefused as e:
            raise PduError(str(e), pdu.event_id) from None
        return version, pdu

    async def _persist_with_parents(
        self, origin: str, version: RoomVersion, pdu: CheckedPdu
    ) -> None:
        """Steps 5-6: fetch missing parents (bounded) and persist."""
        if await self._store.get_event(pdu.event_id) is not None:
            return
        missing = await self._unknown_parents(pdu)
        if missing:
            await self._fetch_missing(origin, version, pdu)
            missing = await self._unknown_parents(pdu)
        if missing:
            raise PduError(
                f"its prev_events {', '.join(sorted(missing))} are unknown here and"
                f" {origin} did not give them (get_missing_events, at most"
                f" {MISSING_EVENTS_LIMIT})"
            )
        await self._persist(origin, pdu)

    async def _unknown_parents(self, pdu: CheckedPdu) -> set[str]:
        event = pdu.event
        parents = await self._store.get_events(list(event.prev_event_ids))
        return {
            p
            for p in event.prev_event_ids
            if p not in parents or parents[p].room_id != event.room_id or parents[p].outlier
        }

    async def _fetch_missing(self, origin: str, version: RoomVersion, pdu: CheckedPdu) -> None:
        """Ask ``origin`` for the events between the room's forward
        extremities and ``pdu`` (at most :data:`MISSING_EVENTS_LIMIT`) and
        persist, oldest first, those that check out and whose own parents
        are then known; the rest are skipped (logged)."""
        room_id = pdu.event.room_id
        extremities = await self._store.get_forward_extremities(room_id)
        body = {
            "earliest_events": sorted(extremities),
            "latest_events": [pdu.event_id],
            "limit": MISSING_EVENTS_LIMIT,
            "min_depth": 0,
        }
        try:
            answer = await self._client.post_json(
                origin, f"/_matrix/federation/v1/get_missing_events/{room_id}", body
            )
        except FederationRequestError as e:
            logger.info("get_missing_events for %s from %s failed: %s", pdu.event_id, origin, e)
            return
        events = answer.get("events") if isinstance(answer, dict) else None
        if not isinstance(events, list):
            logger.info("%s answered get_missing_events without a list of events", origin)
            return
        fetched: list[CheckedPdu] = []
        for raw in events[:MISSING_EVENTS_LIMIT]:
            try:
                found = check_pdu_format(version, raw)
                if found.event.room_id != room_id:
                    raise PduRefused("of another room")
                await check_pdu_signatures(self._keyring, version, found.pdu)
            except PduRefused as e:
                logger.info("A missing event %s gave is refused: %s", origin, e)
                continue
            fetched.append(found)
        fetched.sort(key=lambda f: f.event.depth)
        gaps_filled = 0
        for found in fetched:
            if await self._store.get_event(found.event_id) is not None:
                continue
            unknown = await self._unknown_parents(found)
            if unknown:
                # A gap get_missing_events did not close: the states after
                # its missing parents, asked of the origin (once per PDU).
                if gaps_filled >= MAX_GAPS_FILLED:
                    logger.info("Missing event %s has unknown parents: skipped", found.event_id)
                    continue
                gaps_filled += 1
                try:
                    await self._gaps.persist_filling_gap(origin, version, found, unknown)
                except (PduRefused, FederationRequestError) as e:
                    logger.info("Filling the gap before %s failed: %s", found.event_id, e)
                continue
            try:
                await self._persist(origin, found)
            except PduError as e:
                logger.info("Missing event %s from %s refused: %s", found.event_id, origin, e)

    async def _persist(self, origin: str, pdu: CheckedPdu) -> None:
        """The room's writer stores it with its outcome; a rejection is
        this PDU's error (the event is stored as rejected all the same)."""
        room_id = pdu.event.room_id
        writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
        if writer is None:
            raise PduError(f"room {room_id} is not known here")
        await self._store.store_received_pdu(pdu.event_id, room_id, origin, pdu.pdu)
        try:
            await self._calls.call(
                PERSIST_RECEIVED_PDU, ReceivedEvent(room_id, origin, pdu.pdu), instance=writer
            )
        except SynapseError as e:
            # Refused before it was stored: keep no copy of an event we do
            # not have. Not after a 5xx, where it may have been persisted.
            if e.code < 500 and await self._store.get_event(pdu.event_id) is None:
                await self._store.delete_received_pdu(pdu.event_id)
            raise PduError(e.msg) from None
        stored = await self._store.get_event(pdu.event_id)
        if stored is not None and stored.rejected:
            reason = await self._store.get_rejection_reason(pdu.event_id)
            raise PduError(f"rejected by the room's authorisation rules: {reason or 'stored so'}")


class ReceivedPduWriter:
    """On a room's events writer: serves :data:`PERSIST_RECEIVED_PDU`."""

    def __init__(self, events: EventCreationHandler) -> None:
        self._events = events

    async def persist(self, request: ReceivedEvent) -> EventsPersisted:
        if request.pdu.get("room_id") != request.room_id:
            raise SynapseError(400, "The event is of another room")
        event = await self._events.persist_received_event(request.pdu)
        return EventsPersisted([(event.event_id, event.stream_ordering)])


def _claimed_id(raw: Any) -> str | None:
    """The ``event_id`` a refused PDU names, if any (versions 1-2 carry
    one; later versions' PDUs may, and it is all we can answer under)."""
    event_id = raw.get("event_id") if isinstance(raw, dict) else None
    return event_id if isinstance(event_id, str) and len(event_id) <= 255 else None
