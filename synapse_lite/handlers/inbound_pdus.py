"""The PDUs of a transaction another server sent (``PUT /send/{txnId}``):
each checked as untrusted input by the process that received it, written
to the durable inbound queue before the transaction is answered, and
persisted from there by its room's writer with its outcome
(docs/federation.md, "Inbound" and "Inbound: the durable queue").

On the receiving process (:class:`InboundPdus`), for each PDU, in this
order, anything failing answers that PDU with an ``error`` and queues
nothing of it (the other PDUs go on):

1. its room is one we have (its version decides the format);
2. the format, size and content hash checks (``federation/pdu_checks.py``;
   a hash mismatch keeps the redacted form, as the spec says);
3. the room's server ACL allows the origin, and the origin has a user
   joined to the room now, or the event is the membership of one of the
   origin's own users (a server joining its user directly);
4. the servers that must sign it did (keys from the keyring);
5. its ``prev_events`` are stored (in the graph, not outliers), queued, or
   earlier in this transaction; when some are not, up to
   :data:`MISSING_EVENTS_LIMIT` missing ancestors at a time are asked of
   the origin with ``/get_missing_events``, at most
   :data:`MISSING_EVENTS_REQUESTS_PER_PDU` requests (each event
   checked as in 2 and 4 and queued ahead of it, oldest first); if that
   does not close the gap the PDU is answered with an error and nothing of
   it is queued (decided: it is not kept as an outlier, which would stay
   one: docs/federation.md).

The PDUs that pass (and the ancestors fetched for them) are queued in one
database transaction, shallowest first, so an event's parents come before
it. Then each room's writer is asked (internal call
``process_inbound_pdus``) to take its room's queue now, and the answer
waits up to :data:`OUTCOME_WAIT_SECONDS` for the outcomes: an event stored
(accepted, soft-failed or rejected: rejecting is processing it, the
reason is logged) is answered ``{}``, one the writer refused without
storing it with that error. A PDU whose outcome is not known by then (its writer down or busy)
is answered ``{}``: it was accepted for processing, and is processed
after any restart (the spec lets a server answer so).

On the room's writer (:class:`InboundQueue`), a room's queued PDUs are
taken in queue order, one at a time, by one task per room; different rooms
go on concurrently (at most :data:`ROOMS_AT_ONCE` PDUs in progress), so a
room whose state resolution is expensive holds up only itself. Each is
persisted through :meth:`EventCreationHandler.persist_received_event`
(the spec's three authorisation checks, rejected / soft-failed / accepted)
and leaves the queue in the same database transaction. An event already
stored is answered ``{}`` (a PDU sent twice is idempotent). An unexpected
failure leaves the PDU queued to be tried again (up to
:data:`MAX_ATTEMPTS` tries, then it is dropped, logged) and stops that
room's queue until the next wake-up; the writer sweeps every queue at
startup and every :data:`SWEEP_SECONDS`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

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
from synapse_lite.handlers.message import RoomMovedError
from synapse_lite.handlers.state_gaps import StateGaps
from synapse_lite.replication.http.federation_rooms import (
    PROCESS_INBOUND_PDUS,
    QueuedOutcomes,
    QueuedPdus,
)
from synapse_lite.storage.caches import LruCache
from synapse_lite.storage.databases.main.inbound_pdu_queue import QueuedPdu

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.federation.client import FederationClient
    from synapse_lite.federation.keyring import Keyring
    from synapse_lite.handlers.message import EventCreationHandler
    from synapse_lite.replication.http.calls import InternalCalls
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Missing ancestors asked of the origin per ``get_missing_events`` request
#: (the spec suggests 10).
MISSING_EVENTS_LIMIT = 10
#: ``get_missing_events`` requests per PDU: a gap is walked back a request
#: at a time from the PDU (each asking for the ancestors of the events the
#: last answer left with unknown parents) until it closes, so a peer that
#: was down for a few dozen messages is caught up in order; a wider gap is
#: filled with ``/state_ids`` and its older messages are left to backfill
#: (docs/federation.md, "Catch-up").
MISSING_EVENTS_REQUESTS_PER_PDU = 5
#: ... and per transaction: 50 PDUs with distinct gaps cost no more requests
#: than one request each would.
MISSING_EVENTS_REQUESTS_PER_TRANSACTION = 50
#: How long a /send answer waits for its PDUs' outcomes on their writers
#: before answering ``{}`` for those still queued (the origin's request
#: times out after a minute or more).
OUTCOME_WAIT_SECONDS = 10.0
#: How much longer than that a receiving process waits for the writer.
CALL_MARGIN_SECONDS = 5.0
#: Queued PDUs a writer works on at once, across rooms (one per room).
ROOMS_AT_ONCE = 4
#: Queued PDUs of a room read per query.
QUEUE_BATCH = 50
#: Tries at a queued PDU that fails unexpectedly before it is dropped.
MAX_ATTEMPTS = 3
#: Every queue is swept this often (a wake-up lost with its process).
SWEEP_SECONDS = 10.0
#: Outcomes a writer remembers for callers that ask after the fact.
REMEMBERED_OUTCOMES = 10_000

#: The error of a PDU that failed unexpectedly (the details are logged).
UNPROCESSABLE = "it could not be processed here"
#: Gaps filled with ``/state_ids`` per PDU (``handlers/state_gaps.py``).
MAX_GAPS_FILLED = 1


class PduError(Exception):
    """One PDU's answer in the transaction: ``{"error": str(e)}``, under
    ``event_id`` when it is known (else the id the PDU claims)."""

    def __init__(self, message: str, event_id: str | None = None) -> None:
        super().__init__(message)
        self.event_id = event_id


class InboundPdus:
    """Checks the PDUs of received transactions and queues them for their
    rooms' writers (any process with the ``federation`` resource)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        server_name: str,
        keyring: Keyring,
        client: FederationClient,
        calls: InternalCalls,
        event_writers: Callable[[], Sequence[str]],
    ) -> None:
        self._store = store
        self._clock = clock
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
        left out. Returns once every PDU that passed is in the durable
        queue (see the module docstring)."""
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
                    results[key] = {"error": UNPROCESSABLE}
                continue
            checked.append((version, pdu))
        checked.sort(key=lambda c: c[1].event.depth)
        queue: list[CheckedPdu] = []
        # Stored, queued, or about to be: known as parents.
        known: set[str] = set()
        waiting: dict[str, list[str]] = {}
        requests = _RequestBudget(MISSING_EVENTS_REQUESTS_PER_TRANSACTION)
        for version, pdu in checked:
            try:
                if await self._store.get_event(pdu.event_id) is not None:
                    results[pdu.event_id] = {}
                    continue
                ancestors = await self._with_parents(origin, version, pdu, known, requests)
            except PduError as e:
                logger.info("Refused PDU %s from %s: %s", pdu.event_id, origin, e)
                results[pdu.event_id] = {"error": str(e)}
                continue
            except Exception:
                logger.exception("Checking PDU %s from %s failed", pdu.event_id, origin)
                results[pdu.event_id] = {"error": UNPROCESSABLE}
                continue
            queue.extend(ancestors)
            queue.append(pdu)
            known.update(a.event_id for a in ancestors)
            known.add(pdu.event_id)
            waiting.setdefault(pdu.event.room_id, []).append(pdu.event_id)
        # Durable before the origin hears 200 (a failure here fails the
        # transaction: the origin sends it again).
        await self._store.enqueue_inbound_pdus(
            (p.event_id, p.event.room_id, origin, p.pdu) for p in queue
        )
        for room_id, event_ids in waiting.items():
            outcomes = await self._outcomes(room_id, event_ids)
            for event_id in event_ids:
                results[event_id] = outcomes.get(event_id, {})
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

    async def _with_parents(
        self,
        origin: str,
        version: RoomVersion,
        pdu: CheckedPdu,
        known: set[str],
        requests: _RequestBudget,
    ) -> list[CheckedPdu]:
        """Step 5: the missing ancestors to queue ahead of ``pdu`` (fetched,
        bounded); raises when its parents would still be unknown."""
        if not await self._unknown_parents(pdu, known):
            return []
        fetched = await self._fetch_missing(origin, version, pdu, known, requests)
        missing = await self._unknown_parents(pdu, known | {f.event_id for f in fetched})
        if missing:
            raise PduError(
                f"its prev_events {', '.join(sorted(missing))} are unknown here and"
                f" {origin} did not give them (get_missing_events: at most"
                f" {MISSING_EVENTS_REQUESTS_PER_PDU} requests of {MISSING_EVENTS_LIMIT})"
            )
        return fetched

    async def _unknown_parents(self, pdu: CheckedPdu, known: set[str]) -> set[str]:
        """Parents of ``pdu`` neither in ``known``, nor stored in the graph,
        nor queued."""
        event = pdu.event
        wanted = [p for p in event.prev_event_ids if p not in known]
        if not wanted:
            return set()
        parents = await self._store.get_events(wanted)
        unknown = {
            p
            for p in wanted
            if p not in parents or parents[p].room_id != event.room_id or parents[p].outlier
        }
        if unknown:
            unknown -= await self._store.get_queued_inbound_event_ids(sorted(unknown))
        return unknown

    async def _fetch_missing(
        self,
        origin: str,
        version: RoomVersion,
        pdu: CheckedPdu,
        known: set[str],
        requests: _RequestBudget,
    ) -> list[CheckedPdu]:
        """Ask ``origin`` for the events between the room's forward
        extremities and ``pdu``, :data:`MISSING_EVENTS_LIMIT` at a time, each
        request asking for the ancestors of the events the last answer left
        with unknown parents (at most :data:`MISSING_EVENTS_REQUESTS_PER_PDU`
        requests, and while the transaction's ``requests`` allow): those that check
        out, are not stored or known, and whose own parents are then known,
        oldest first; the rest are skipped (logged)."""
        room_id = pdu.event.room_id
        extremities = sorted(await self._store.get_forward_extremities(room_id))
        found_by_id: dict[str, CheckedPdu] = {}
        latest = [pdu.event_id]
        for _ in range(MISSING_EVENTS_REQUESTS_PER_PDU):
            if not latest or not requests.take():
                break
            answer = await self._ask_missing(origin, version, room_id, extremities, latest)
            new = [
                f
                for f in answer
                if f.event_id not in found_by_id
                and f.event_id not in known
                and f.event_id != pdu.event_id
                and await self._store.get_event(f.event_id) is None
            ]
            found_by_id.update((f.event_id, f) for f in new)
            pending = known | set(found_by_id) | {pdu.event_id}
            # The next request starts where this answer's gap is still open.
            latest = sorted([f.event_id for f in new if await self._unknown_parents(f, pending)])
        fetched = sorted(found_by_id.values(), key=lambda f: f.event.depth)
        usable: list[CheckedPdu] = []
        gaps_filled = 0
        for found in fetched:
            if found.event_id in known or await self._store.get_event(found.event_id) is not None:
                continue
            pending = known | {u.event_id for u in usable}
            unknown = await self._unknown_parents(found, pending)
            if unknown:
                # A gap get_missing_events did not close: the states after
                # its missing parents, asked of the origin (once per PDU)
                # and persisted now, before the answer (so as durable as the
                # queue). Not where a parent is only queued: its writer has
                # not persisted it, so the state after it is not known here.
                if gaps_filled >= MAX_GAPS_FILLED or pending & set(found.event.prev_event_ids):
                    logger.info("Missing event %s has unknown parents: skipped", found.event_id)
                    continue
                gaps_filled += 1
                try:
                    await self._gaps.persist_filling_gap(origin, version, found, unknown)
                except (PduRefused, FederationRequestError) as e:
                    logger.info("Filling the gap before %s failed: %s", found.event_id, e)
                continue
            usable.append(found)
        return usable

    async def _ask_missing(
        self,
        origin: str,
        version: RoomVersion,
        room_id: str,
        earliest: list[str],
        latest: list[str],
    ) -> list[CheckedPdu]:
        """One ``get_missing_events`` request: the events ``origin`` gives
        (at most :data:`MISSING_EVENTS_LIMIT`) that check out (format,
        room, signatures); the rest are skipped (logged). Nothing when the
        request fails or the answer is malformed."""
        body = {
            "earliest_events": earliest,
            "latest_events": latest,
            "limit": MISSING_EVENTS_LIMIT,
            "min_depth": 0,
        }
        try:
            answer = await self._client.post_json(
                origin, f"/_matrix/federation/v1/get_missing_events/{room_id}", body
            )
        except FederationRequestError as e:
            logger.info("get_missing_events before %s from %s failed: %s", latest, origin, e)
            return []
        events = answer.get("events") if isinstance(answer, dict) else None
        if not isinstance(events, list):
            logger.info("%s answered get_missing_events without a list of events", origin)
            return []
        checked: list[CheckedPdu] = []
        for raw in events[:MISSING_EVENTS_LIMIT]:
            try:
                found = check_pdu_format(version, raw)
                if found.event.room_id != room_id:
                    raise PduRefused("of another room")
                await check_pdu_signatures(self._keyring, version, found.pdu)
            except PduRefused as e:
                logger.info("A missing event %s gave is refused: %s", origin, e)
                continue
            checked.append(found)
        return checked

    async def _outcomes(self, room_id: str, event_ids: list[str]) -> dict[str, Any]:
        """What the room's writer knows of ``event_ids`` within its bounded
        wait; nothing when it cannot be reached (they stay queued)."""
        writer = await self._store.get_event_writer_for_room(room_id, self._event_writers())
        if writer is None:
            return {}
        call = defer.ensureDeferred(
            self._calls.call(PROCESS_INBOUND_PDUS, QueuedPdus(room_id, event_ids), instance=writer)
        )
        try:
            # A writer that hangs (stopped, overloaded) does not hold the
            # answer beyond its own wait and a margin.
            answer = await self._clock.timeout(call, OUTCOME_WAIT_SECONDS + CALL_MARGIN_SECONDS)
        except (SynapseError, defer.TimeoutError) as e:
            why = e.msg if isinstance(e, SynapseError) else "no answer in time"
            logger.info("%s did not take the queue of %s now (%s): it will", writer, room_id, why)
            return {}
        outcomes: dict[str, Any] = answer.outcomes
        return outcomes


class _RequestBudget:
    """Requests of one kind a transaction may still make."""

    def __init__(self, requests: int) -> None:
        self._left = requests

    def take(self) -> bool:
        """Whether one more request may be made (counting it)."""
        if self._left <= 0:
            return False
        self._left -= 1
        return True


class InboundQueue:
    """On an events writer: persists the queued PDUs of the rooms it
    writes (see the module docstring); serves :data:`PROCESS_INBOUND_PDUS`.
    A process loop (``start``/``stop``)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        events: EventCreationHandler,
        instance_name: str,
        event_writers: Callable[[], Sequence[str]],
        rooms_at_once: int = ROOMS_AT_ONCE,
    ) -> None:
        self._store = store
        self._clock = clock
        self._events = events
        self._me = instance_name
        self._event_writers = event_writers
        self._slots = defer.DeferredSemaphore(rooms_at_once)
        # One task per room: the rooms being drained, and those woken
        # while their task ran (it looks again before it ends).
        self._draining: dict[str, defer.Deferred[None]] = {}
        self._woken: set[str] = set()
        self._outcomes: LruCache[dict[str, str]] = LruCache(REMEMBERED_OUTCOMES)
        self._waiters: dict[str, list[defer.Deferred[None]]] = {}
        self._positions: LruCache[int] = LruCache(REMEMBERED_OUTCOMES)
        self._loop: Any = None
        self._stopping = False

    def start(self) -> None:
        self._stopping = False
        self._loop = self._clock.looping_call(self._sweep_in_background, SWEEP_SECONDS)
        # What a killed process left queued.
        self._sweep_in_background()

    def stop(self) -> defer.Deferred[None]:
        self._stopping = True
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None
        return defer.DeferredList(list(self._draining.values())).addCallback(lambda _: None)

    def _sweep_in_background(self) -> None:
        defer.ensureDeferred(self.sweep()).addErrback(
            lambda f: logger.error("Sweeping the inbound queue failed: %s", f.getTraceback())
        )

    async def sweep(self) -> None:
        """Take every queued room this process writes (startup, and every
        :data:`SWEEP_SECONDS`: a wake-up may have been lost)."""
        writers = self._event_writers()
        for room_id in await self._store.get_inbound_queue_rooms():
            if await self._store.get_event_writer_for_room(room_id, writers) == self._me:
                self.wake(room_id)

    def wake(self, room_id: str) -> defer.Deferred[None]:
        """Drain ``room_id``'s queue (its task, started unless running);
        fires when that task ends."""
        self._woken.add(room_id)
        running = self._draining.get(room_id)
        if running is not None:
            return _follow(running)
        if self._stopping:
            return defer.succeed(None)
        d = defer.ensureDeferred(self._drain(room_id))
        self._draining[room_id] = d
        d.addErrback(
            lambda f: logger.error(
                "Draining the inbound queue of %s failed: %s", room_id, f.getTraceback()
            )
        )
        d.addBoth(lambda _: self._draining.pop(room_id, None) and None)
        return _follow(d)

    async def process(self, request: QueuedPdus) -> QueuedOutcomes:
        """:data:`PROCESS_INBOUND_PDUS`: wake the room and wait (bounded)
        for the outcomes of ``request.event_ids``."""
        pending: list[tuple[str, defer.Deferred[None]]] = []
        for event_id in request.event_ids:
            if not self._outcomes.get(event_id)[0]:
                d: defer.Deferred[None] = defer.Deferred()
                self._waiters.setdefault(event_id, []).append(d)
                pending.append((event_id, d))
        self.wake(request.room_id)
        if pending:
            # Out of the queue already with no outcome here (processed
            # before this process started): read what was stored.
            queued = await self._store.get_queued_inbound_event_ids([e for e, _ in pending])
            for event_id, _ in pending:
                if event_id not in queued and not self._outcomes.get(event_id)[0]:
                    await self._settle_from_store(event_id)

            # Cancelled at the deadline: it fires then with what is known.
            everything = defer.DeferredList([d for _, d in pending], consumeErrors=True)
            timer = self._clock.call_later(OUTCOME_WAIT_SECONDS, everything.cancel)
            await everything
            if timer.active():
                timer.cancel()
            for event_id, d in pending:
                waiters = self._waiters.get(event_id, [])
                if d in waiters:
                    waiters.remove(d)
                if not waiters:
                    self._waiters.pop(event_id, None)
        outcomes: dict[str, Any] = {}
        for event_id in request.event_ids:
            known, outcome = self._outcomes.get(event_id)
            if known and outcome is not None:
                outcomes[event_id] = outcome
        position = max((self._positions.get(e)[1] or 0 for e in request.event_ids), default=0)
        return QueuedOutcomes(outcomes, position)

    async def _drain(self, room_id: str) -> None:
        """The room's one task: its queued PDUs in order, until none is
        left, the process stops, or one fails unexpectedly."""
        while not self._stopping:
            self._woken.discard(room_id)
            batch = await self._store.get_inbound_queue(room_id, QUEUE_BATCH)
            if not batch:
                if room_id in self._woken:
                    continue
                return
            for queued in batch:
                if self._stopping:
                    return
                async with self._slots:
                    carry_on = await self._process_one(queued)
                if not carry_on:
                    return

    async def _process_one(self, queued: QueuedPdu) -> bool:
        """Persist one queued PDU with its outcome; whether the room's
        queue goes on now."""
        try:
            event = await self._events.persist_received_event(queued.pdu, from_inbound_queue=True)
        except RoomMovedError:
            # Its new writer takes the queue (its sweep, or the next wake-up).
            logger.info("Room %s moved: its inbound queue is for its new writer", queued.room_id)
            return False
        except SynapseError as e:
            if e.code >= 500:
                return await self._failed(queued)
            # Refused before it was stored (its parents' state unknown, a
            # malformed or misplaced event): nothing of it is kept.
            logger.info("Queued PDU %s from %s refused: %s", queued.event_id, queued.origin, e.msg)
            await self._store.remove_inbound_pdu(queued.event_id)
            self._settle(queued.event_id, {"error": e.msg})
            return True
        except Exception:
            return await self._failed(queued)
        self._positions.set(event.event_id, event.stream_ordering)
        self._settle(event.event_id, await self._outcome_of_stored(event.event_id, event.rejected))
        return True

    async def _failed(self, queued: QueuedPdu) -> bool:
        """An unexpected failure: left queued to be tried again (the room
        waits for its next wake-up), or dropped after
        :data:`MAX_ATTEMPTS` tries."""
        logger.exception("Persisting queued PDU %s from %s failed", queued.event_id, queued.origin)
        try:
            attempts = await self._store.count_inbound_pdu_failure(queued.event_id)
        except Exception:
            logger.exception("Counting the failure of %s failed", queued.event_id)
            return False
        if attempts < MAX_ATTEMPTS:
            return False
        logger.error(
            "Dropping queued PDU %s from %s after %d failed tries",
            queued.event_id,
            queued.origin,
            attempts,
        )
        await self._store.remove_inbound_pdu(queued.event_id)
        self._settle(queued.event_id, {"error": UNPROCESSABLE})
        return True

    async def _settle_from_store(self, event_id: str) -> None:
        """The outcome of a PDU that left the queue: its stored event's
        (nothing is known of one refused unstored: no outcome)."""
        event = await self._store.get_event(event_id)
        if event is None:
            # Refused by an earlier life of this process: its waiters stop
            # waiting, and the PDU is answered ``{}``.
            for d in self._waiters.pop(event_id, []):
                if not d.called:
                    d.callback(None)
            return
        self._positions.set(event_id, event.stream_ordering)
        self._settle(event_id, await self._outcome_of_stored(event_id, event.rejected))

    async def _outcome_of_stored(self, event_id: str, rejected: bool) -> dict[str, str]:
        """``{}`` for every stored event: a rejected one was processed as
        the spec has it (stored as rejected; the sender can do nothing
        about it), which is no error in processing (the reference server
        answers so too); why is in our log and the ``rejections`` table."""
        if rejected:
            reason = await self._store.get_rejection_reason(event_id)
            logger.info("PDU %s rejected by the room's authorisation rules: %s", event_id, reason)
        return {}

    def _settle(self, event_id: str, outcome: dict[str, str]) -> None:
        self._outcomes.set(event_id, outcome)
        for d in self._waiters.pop(event_id, []):
            if not d.called:
                d.callback(None)


def _follow(d: defer.Deferred[None]) -> defer.Deferred[None]:
    """A Deferred firing (with None) when ``d`` does, whatever its result."""
    follower: defer.Deferred[None] = defer.Deferred()

    def fire(_: object) -> object:
        if not follower.called:
            follower.callback(None)
        return _

    d.addBoth(fire)
    return follower


def _claimed_id(raw: Any) -> str | None:
    """The ``event_id`` a refused PDU names, if any (versions 1-2 carry
    one; later versions' PDUs may, and it is all we can answer under)."""
    event_id = raw.get("event_id") if isinstance(raw, dict) else None
    return event_id if isinstance(event_id, str) and len(event_id) <= 255 else None
