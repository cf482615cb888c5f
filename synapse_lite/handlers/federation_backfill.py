"""Backfill: history of a room we do not hold, asked of the other servers in
it when a reader pages back past what we have (docs/federation.md,
"Backfill").

:class:`Backfiller` runs on the process answering ``/messages`` (any with
the client API): when a backward page in a room that other servers share
reads an event whose ``prev_events`` we have not stored (a hole), or
reaches the start of what we hold, it takes those missing events (else the
room's **backward extremities**), asks the servers with a user joined to
the room, one after the other, ``GET
/_matrix/federation/v1/backfill/{roomId}?v=…&limit=…``, and checks each
event of the answer as untrusted input before anything is stored:

1. at most :data:`BACKFILL_LIMIT` events are read; each must be of the
   room's version and within the spec's limits (``check_pdu_format``: a
   content hash that does not match keeps the redacted form), of **this
   room**, and signed by every server that must sign it (keys from the
   keyring, valid at the event's time);
2. events already stored are left out.

The room's events writer (:class:`BackfillWriter`, the internal call
``persist_backfilled``) then checks each event against **its own auth
events** (stored, or earlier in the same answer; an event they do not
allow, or whose auth events are unknown, is dropped and logged) and stores
the rest in one transaction on the **backfill stream**
(``EventsStore.persist_backfilled_events``: negative stream orderings, the
deepest nearest zero), so ``/messages`` reads them, on every process, after
everything already held and among themselves by depth.

Bounds: one round (one answer stored) per ``/messages`` request; the same
extremities that gave nothing new are not asked again for
:data:`RETRY_AFTER_MS`; at most :data:`MAX_SERVERS` servers are asked.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from synapse_lite.api.errors import NotFoundError, SynapseError
from synapse_lite.api.identifiers import server_of
from synapse_lite.event_graph.authorisation import EventAuthError, auth_events_state, authorise
from synapse_lite.event_graph.pdu import Pdu, StateKey, stored_as_pdu
from synapse_lite.federation.client import FederationRequestError
from synapse_lite.federation.pdu_checks import CheckedPdu, PduRefused, check_room_pdu
from synapse_lite.handlers.message import RoomMovedError
from synapse_lite.handlers.received_events import pdu_as_content, received_pdu
from synapse_lite.keyed_locks import KeyedLocks
from synapse_lite.replication.http.federation_rooms import PERSIST_BACKFILLED, BackfilledEvents
from synapse_lite.replication.http.send_events import EventsPersisted

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.events import EventContent
    from synapse_lite.federation.client import FederationClient
    from synapse_lite.federation.keyring import Keyring
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Events asked for (and read of an answer) per backfill.
BACKFILL_LIMIT = 100
#: Backward extremities named as ``v`` per request.
MAX_EXTREMITIES = 20
#: Servers asked, one after the other, per backfill.
MAX_SERVERS = 3
#: How long the same backward extremities that gave nothing new are not
#: asked for again.
RETRY_AFTER_MS = 60_000

CREATE: StateKey = ("m.room.create", "")


class Backfiller:
    """Fetches a room's history from other servers (any process with the
    client API and a federation client; the room's writer persists)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        server_name: str,
        client: Callable[[], FederationClient],
        keyring: Callable[[], Keyring],
        calls: InternalCalls,
        event_writers: Callable[[], Sequence[str]],
    ) -> None:
        self._store = store
        self._clock = clock
        self._server_name = server_name
        self._client = client
        self._keyring = keyring
        self._calls = calls
        self._event_writers = event_writers
        #: room -> (extremities asked, when) of a backfill that stored nothing.
        self._fruitless: dict[str, tuple[frozenset[str], int]] = {}

    async def servers_to_ask(self, room_id: str) -> list[str]:
        """The other servers with a user joined to ``room_id`` (none: the
        room is ours alone, nothing to backfill), in name order."""
        return sorted(
            {server_of(u) for u in await self._store.get_users_in_room(room_id)}
            - {self._server_name}
        )

    async def backfill(self, room_id: str, read: Sequence[str], at_start: bool) -> int:
        """One round of backfill of ``room_id`` for a backward page that
        read the events ``read`` (and the one just after it, when the
        caller includes it): the missing ``prev_events`` of those (holes in
        the history being read) or, when there are none and the page
        reached the start of what we hold (``at_start``), the room's
        backward extremities. How many events were stored (0 when there is
        nothing to ask, nobody to ask, or no answer gave anything new).
        Never raises for another server's failure."""
        servers = await self.servers_to_ask(room_id)
        if not servers:
            return 0
        extremities = await self._store.get_missing_prev_events(read, MAX_EXTREMITIES)
        if not extremities and at_start:
            extremities = await self._store.get_backward_extremities(room_id, MAX_EXTREMITIES)
        if not extremities:
            return 0
        asked = frozenset(extremities)
        fruitless = self._fruitless.get(room_id)
        now = self._clock.time_msec()
        if fruitless is not None and fruitless[0] == asked and now - fruitless[1] < RETRY_AFTER_MS:
            return 0
        stored = 0
        for server in servers[:MAX_SERVERS]:
            try:
                stored = await self._backfill_from(server, room_id, extremities)
            except (FederationRequestError, SynapseError) as e:
                logger.info("Backfilling %s from %s failed: %s", room_id, server, e)
                continue
            if stored:
                break
        if stored:
            self._fruitless.pop(room_id, None)
        else:
            self._fruitless[room_id] = (asked, now)
        return stored

    async def _backfill_from(self, server: str, room_id: str, extremities: list[str]) -> int:
        query = urllib.parse.urlencode(
            [("v", e) for e in extremities] + [("limit", BACKFILL_LIMIT)]
        )
        path = f"/_matrix/federation/v1/backfill/{urllib.parse.quote(room_id, safe='')}?{query}"
        answer = await self._client().get_json(server, path)
        pdus = answer.get("pdus") if isinstance(answer, dict) else None
        if not isinstance(pdus, list):
            logger.info("%s answered /backfill of %s without a list of pdus", server, room_id)
            return 0
        checked = await self.check_answer(room_id, pdus)
        if not checked:
            return 0
        writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
        if writer is None:
            raise NotFoundError(f"room {room_id} is not known here")
        persisted: EventsPersisted = await self._calls.call(
            PERSIST_BACKFILLED,
            BackfilledEvents(room_id, server, {"pdus": [c.pdu for c in checked]}),
            instance=writer,
        )
        logger.info(
            "Backfilled %d of %d events of %s from %s",
            len(persisted.events), len(pdus), room_id, server,
        )  # fmt: skip
        return len(persisted.events)

    async def check_answer(self, room_id: str, pdus: Sequence[Any]) -> list[CheckedPdu]:
        """Step 1-2 of the module docstring: the events of a ``/backfill``
        answer that may go to the writer (each refused one is logged)."""
        version = await self._store.get_room_version(room_id)
        checked: dict[str, CheckedPdu] = {}
        for raw in pdus[:BACKFILL_LIMIT]:
            try:
                pdu = await check_room_pdu(self._keyring(), version, room_id, raw)
            except PduRefused as e:
                logger.info("A backfilled event of %s is refused: %s", room_id, e)
                continue
            checked.setdefault(pdu.event_id, pdu)
        stored = await self._store.get_events(sorted(checked))
        return [c for i, c in checked.items() if i not in stored]


class BackfillWriter:
    """On a room's events writer: serves :data:`PERSIST_BACKFILLED`."""

    def __init__(
        self, store: GenericWorkerStore, me: str, event_writers: Callable[[], Sequence[str]]
    ) -> None:
        self._store = store
        self._me = me
        self._event_writers = event_writers
        #: One backfill of a room at a time (two answers may share events).
        self._room_locks = KeyedLocks()

    async def persist(self, request: BackfilledEvents) -> EventsPersisted:
        room_id = request.room_id
        writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
        if writer is None:
            raise NotFoundError("Unknown room")
        if writer != self._me:
            raise RoomMovedError(room_id)
        async with self._room_locks.hold(room_id):
            accepted = await self._authorised(room_id, request.answer.get("pdus"))
            if not accepted:
                return EventsPersisted([])
            persisted = await self._store.persist_backfilled_events(
                room_id, request.origin, accepted
            )
        return EventsPersisted([(e.event_id, e.stream_ordering) for e in persisted])

    async def _authorised(
        self, room_id: str, pdus: Any
    ) -> list[tuple[EventContent, dict[str, Any]]]:
        """The events of ``pdus`` not stored yet that their own auth events
        (stored and not rejected, or accepted earlier in this batch) allow,
        shallowest first; the rest are logged and dropped."""
        if not isinstance(pdus, list):
            raise SynapseError(400, "pdus must be a list")
        version = await self._store.get_room_version(room_id)
        events: dict[str, tuple[Pdu, dict[str, Any]]] = {}
        for raw in pdus[:BACKFILL_LIMIT]:
            if not isinstance(raw, dict) or raw.get("room_id") != room_id:
                continue
            event = received_pdu(version, raw)
            events.setdefault(event.event_id, (event, raw))
        stored = await self._store.get_events(sorted(events))
        batch = sorted((e for i, e in events.items() if i not in stored), key=lambda e: e[0].depth)
        wanted = {a for event, _ in batch for a in event.auth_event_ids}
        current = await self._store.get_current_state_ids(room_id)
        if CREATE in current:
            wanted.add(current[CREATE])
        loaded = await self._store.get_events(sorted(wanted))
        known = {i: stored_as_pdu(e) for i, e in loaded.items() if not e.rejected}
        create = known.get(current.get(CREATE, ""))
        accepted: list[tuple[EventContent, dict[str, Any]]] = []
        for event, raw in batch:
            if event.type == "m.room.create" and event.state_key == "":
                # The room's create event is the one its join gave (an
                # outlier already); another is not this room's.
                logger.info("Backfilled create event %s of %s dropped", event.event_id, room_id)
                continue
            missing = [a for a in event.auth_event_ids if a not in known]
            if missing:
                logger.info(
                    "Backfilled event %s dropped: auth events not known: %s",
                    event.event_id, ", ".join(missing),
                )  # fmt: skip
                continue
            try:
                own = auth_events_state(
                    version, event, [known[a] for a in event.auth_event_ids], create=create
                )
                authorise(version, event, own)
            except EventAuthError as e:
                logger.info("Backfilled event %s dropped: %s", event.event_id, e.reason)
                continue
            known[event.event_id] = event
            accepted.append((pdu_as_content(event), raw))
        return accepted
