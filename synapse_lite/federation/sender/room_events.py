"""Room events for other servers: which servers each event goes to, and the
PDUs the transactions carry (docs/federation.md, "Outbound: room events").

:class:`RoomEventsFeed` runs beside the sender. It follows the events
stream (every events writer's rows, and this process's own writes), reads
the served events (no rejected, soft-failed or outlier events) in stream
order, records per destination and room the newest event for it
(``destination_rooms``, with how far it has written them, in one
transaction per batch, for every destination whichever sender owns it) and
then gives each event that is ours to send to :func:`destinations_of`'s
servers' queues, in order. It starts where the feeds of earlier runs
stopped writing, or lower: at the lowest ``pdus_sent_upto`` of the
destinations this sender owns that are behind, so they resume exactly
where they stopped (within ``pdu_queue.MAX_REPLAY_POSITIONS``; further
behind, they catch up: ``pdu_queue.py``).

Which events are ours to send (pure, :func:`should_send`): those our users
sent, and the membership events of other servers' users that reached us by
``send_join``/``send_leave`` (the joining server knows no one else in the
room: the spec has the resident server pass them on). Each goes to every
server with a user joined to the room just before it (:func:`joined_before`:
the room's current members with the membership changes at or after the
event undone, so a server that joined after an event the feed reads late
is not sent it; it asks for the history its visibility allows), and for a
membership event to
the server of its target (a kicked or banned user's server hears of it),
never to us, to the server whose user sent it, nor to the server it came
from; nor to a server the room's current ``m.room.server_acl`` denies.

:class:`PduRenderer` gives the PDUs in the federation format, for
transactions and for every federation endpoint that serves events: ours
signed with our key (``ClientEventFormatter.federation_format``), other
servers' as they sent them (``received_pdus``); without ``unsigned``, and
without the ``event_id`` that versions 3 on must not carry.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from synapse_lite.api.identifiers import server_of
from synapse_lite.api.room_versions import EventIdFormat
from synapse_lite.event_graph.pdu import room_id_of_create
from synapse_lite.events import pruned_event
from synapse_lite.federation.sender.pdu_queue import MAX_REPLAY_POSITIONS, FeedProgress
from synapse_lite.federation.server_acl import room_acl, server_allowed
from synapse_lite.storage.databases.main.destination_rooms import DestinationRoom, QueuedPdu
from synapse_lite.storage.databases.main.roommember import MemberChange

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.events import Event
    from synapse_lite.handlers.client_events import ClientEventFormatter
    from synapse_lite.replication.notifier import ReplicationNotifier
    from synapse_lite.storage.databases.main import GenericWorkerStore
    from synapse_lite.tokens import RoomStreamToken

logger = logging.getLogger(__name__)

#: Events read per look at the stream.
BATCH = 100
#: The feed looks at most this often: a wake-up sooner after the last look
#: waits for the rest of it, so a burst is read, recorded and queued some
#: events at a time rather than one (fewer database writes, fuller
#: transactions); an event after a quiet spell goes at once.
COALESCE_SECONDS = 0.05
#: A batch with nothing for any destination records the feed's position
#: only this far past the last recorded one (a server without federation
#: pays no write per batch; a restart re-reads at most this much).
RECORD_POSITION_EVERY = 500
#: Rooms whose joined users the feed keeps (forgotten all at once beyond).
MAX_ROOMS_CACHED = 10_000
#: Transaction PDUs kept rendered, newest used last out: a burst goes to
#: every destination within about this many events, and is rendered and
#: signed once, not once per destination.
MAX_RENDERED_CACHED = 5_000
#: Rooms the events stream's change tracker may remember for the feed to
#: look for new events in rooms with other servers in memory; beyond, it
#: reads the events.
MAX_ROOMS_WALKED = 2_000


def should_send(event: Event, server_name: str, origin: str | None) -> bool:
    """Whether we send ``event`` to other servers: it is our user's, or
    (``origin``: the server it came from, None for ours) a membership of
    the origin's own user that reached us through send_join/send_leave,
    which the origin cannot pass on itself."""
    if server_of(event.sender) == server_name:
        return True
    return (
        origin is not None
        and event.type == "m.room.member"
        and event.state_key == event.sender
        and server_of(event.sender) == origin
    )


def joined_before(
    current: frozenset[str], changes: Sequence[MemberChange], stream_ordering: int
) -> frozenset[str]:
    """The users joined to a room just before its event at
    ``stream_ordering``: ``current`` (its joined users, read before
    ``changes``) with each user's first change of ``changes`` (the room's,
    oldest first, every one after some position before the event) at or
    after the event undone."""
    replaced: dict[str, str | None] = {}
    for change in changes:
        if change.stream_id >= stream_ordering and change.user_id not in replaced:
            replaced[change.user_id] = change.replaced
    if not replaced:
        return current
    kept = {u for u in current if u not in replaced}
    return frozenset(kept | {u for u, m in replaced.items() if m == "join"})


def destinations_of(
    event: Event, joined: Iterable[str], server_name: str, origin: str | None
) -> list[str]:
    """The servers ``event`` goes to: those of the ``joined`` users, and
    of a membership event's target (a kicked or banned user's) but an
    invite's (its server had it through ``/invite``, and may not know the
    room); never us, the sender's server nor ``origin``. Sorted."""
    servers = {server_of(u) for u in joined}
    if event.type == "m.room.member" and event.state_key and event.membership != "invite":
        servers.add(server_of(event.state_key))
    servers -= {server_name, server_of(event.sender)}
    if origin is not None:
        servers.discard(origin)
    return sorted(servers)


class PduRenderer:
    """Events in the federation format (see the module docstring)."""

    def __init__(
        self, store: GenericWorkerStore, formatter: ClientEventFormatter, clock: Clock
    ) -> None:
        self._store = store
        self._formatter = formatter
        self._clock = clock
        self._rendered: OrderedDict[str, dict[str, Any]] = OrderedDict()

    async def pdus_by_id(self, event_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Those of ``event_ids`` we have, by id, in the server-server form:
        other servers' as they sent them, ours rendered and signed; without
        ``unsigned``, and from version 3 without ``event_id`` (which such
        PDUs must not carry: Synapse refuses them); our erased users'
        pruned (:meth:`_unerased`)."""
        ids = list(dict.fromkeys(event_ids))
        received = await self._store.get_received_pdus(ids)
        local_ids = [e for e in ids if e not in received]
        found = await self._store.get_events(local_ids) if local_ids else {}
        rendered = await self._formatter.federation_format(
            await self._unerased([found[e] for e in local_ids if e in found]),
            self._clock.time_msec(),
        )
        by_id: dict[str, dict[str, Any]] = {pdu["event_id"]: pdu for pdu in rendered}
        by_id.update(received)
        # Another server's event redacted since is served redacted (its
        # signatures still verify; its content hash no longer matches).
        for event_id, event in (await self._store.get_events(list(received))).items():
            if event.redacted_because is not None:
                version = await self._store.get_room_version(event.room_id)
                by_id[event_id] = pruned_event(version, received[event_id])
        for event_id, pdu in by_id.items():
            # A version 12 create event has no ``room_id``: its id names the room.
            room_id = pdu.get("room_id") or room_id_of_create(event_id)
            version = await self._store.get_room_version(room_id)
            drop = {"unsigned"}
            if version.event_ids is not EventIdFormat.SERVER_SUFFIXED:
                drop.add("event_id")
            by_id[event_id] = {k: v for k, v in pdu.items() if k not in drop}
        return by_id

    async def _unerased(self, events: list[Event]) -> list[Event]:
        """``events`` with those of our erased users pruned (as a
        redaction prunes; their hashes stay the original's): another server
        that asks for one after the erasure gets none of its content, as
        our own users who could not see it then do not (one cached lookup
        per sender)."""
        result = []
        for event in events:
            if (
                event.redacted_because is None
                and await self._store.get_erasure_position(event.sender) is not None
            ):
                event = event.pruned(await self._store.get_room_version(event.room_id))
            result.append(event)
        return result

    async def transaction_pdus(self, event_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The PDUs of a transaction (:meth:`pdus_by_id`), in the order
        given; events we no longer have are left out. The last
        :data:`MAX_RENDERED_CACHED` are kept: a destination given one a
        little after another gets it as rendered then (a redaction that
        came in between reaches it as the next event, as it would have had
        it been as quick)."""
        cache = self._rendered
        missing = [e for e in event_ids if e not in cache]
        if missing:
            cache.update(await self.pdus_by_id(missing))
            while len(cache) > MAX_RENDERED_CACHED:
                cache.popitem(last=False)
        found = []
        for event_id in event_ids:
            pdu = cache.get(event_id)
            if pdu is not None:
                cache.move_to_end(event_id)
                found.append(pdu)
        return found


class RoomEventsFeed:
    """Follows the events stream and queues each event for its servers
    (see the module docstring)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        server_name: str,
        queue_pdus: Callable[[str, Sequence[QueuedPdu]], None],
        local_writes: ReplicationNotifier,
        progress: FeedProgress,
        owns: Callable[[str], bool] = lambda destination: True,
        catch_up: Callable[[Collection[str]], None] = lambda destinations: None,
        filled: Callable[[], None] = lambda: None,
        coalesce_seconds: float = COALESCE_SECONDS,
    ) -> None:
        """``queue_pdus(destination, pdus)``: the sender's queue for a
        destination takes those events, in order. ``progress``: where this
        feed is, kept up to date for the queues. ``owns``: the destinations
        of this sender. ``catch_up(destinations)``: at start, the owned
        destinations that are behind. ``filled()``: ``destination_rooms``
        is written up to where memory starts (``progress.live_from``).
        ``coalesce_seconds``: the shortest time between two looks (0: none)."""
        self._store = store
        self._clock = clock
        self._server_name = server_name
        self._queue_pdus = queue_pdus
        self._progress = progress
        self._owns = owns
        self._catch_up = catch_up
        self._filled = filled
        self._position: int | None = None
        self._coalesce_seconds = coalesce_seconds
        self._look_call: Any = None
        self._last_look = float("-inf")
        #: The feed position last written (``federation_feed_position``).
        self._recorded_upto = 0
        self._running = False
        self._again = False
        self._stopped = False
        #: room -> (its joined users, the position they are current at).
        self._joined: dict[str, tuple[frozenset[str], RoomStreamToken]] = {}
        local_writes.add_replication_callback(self.wake)

    def start(self) -> None:
        self._stopped = False
        d = defer.ensureDeferred(self._start())
        d.addErrback(self._start_failed)

    def _start_failed(self, failure: Any) -> None:
        if not self._stopped:
            logger.error("Starting the room events feed failed: %s", failure.value)

    async def _start(self) -> None:
        """Where to read from and where memory starts (module docstring)."""
        store = self._store
        current = store.get_room_max_stream_ordering()
        written = await store.get_federation_feed_position()
        fill_from = current if written is None else min(written, current)
        behind = {d: s for d, s in (await store.get_destinations_behind()).items() if self._owns(d)}
        if current - fill_from > MAX_REPLAY_POSITIONS:
            live_from = current
        else:
            replay = [s for s in behind.values() if current - s <= MAX_REPLAY_POSITIONS]
            live_from = min([fill_from, *replay])
        self._progress.live_from = live_from
        self._progress.filled_upto = fill_from
        self._position = min(fill_from, live_from)
        self._recorded_upto = fill_from
        logger.info(
            "Room events for other servers: from position %d (written up to %d, now %d);"
            " %d destination(s) of ours behind",
            self._position,
            fill_from,
            current,
            len(behind),
        )
        self._catch_up(sorted(behind))
        if self._progress.filled_past_live_from:
            self._filled()
        self.wake()

    def stop(self) -> None:
        self._stopped = True
        if self._look_call is not None and self._look_call.active():
            self._look_call.cancel()
        self._look_call = None

    def on_rows(self, writer: str, token: int, rows: Sequence[Any]) -> None:
        """Row hook of the events stream (rows another process wrote). It
        runs before this process's position moves past them: look once it
        has."""
        self._clock.call_later(0, self.wake)
        self.wake()

    def wake(self) -> None:
        """New events may be stored: look soon (cheap, safe to call
        spuriously)."""
        if self._position is None or self._stopped:
            return
        if self._running:
            self._again = True
            return
        if self._look_call is not None:
            return
        wait = self._last_look + self._coalesce_seconds - self._clock.time()
        if wait <= 0:
            self._look()
        else:
            self._look_call = self._clock.call_later(wait, self._look)

    def _look(self) -> None:
        self._look_call = None
        if self._running or self._stopped:
            return
        self._last_look = self._clock.time()
        self._running = True
        defer.ensureDeferred(self._run())

    async def _run(self) -> None:
        try:
            self._again = False
            # Full batches back to back; then wait for more.
            while await self._take_batch():
                pass
        except Exception:
            if not self._stopped:
                logger.exception("Reading room events for other servers failed")
        finally:
            self._running = False
        if self._again:
            self.wake()

    async def _take_batch(self) -> bool:
        """Queue the next events; whether there may be more."""
        assert self._position is not None
        upto = self._store.get_room_max_stream_ordering()
        if upto <= self._position:
            return False
        if await self._nothing_to_send(self._position, upto):
            await self._passed(upto, [], {})
            return False
        events = await self._store.get_stream_events_between(self._position, upto, BATCH)
        full = len(events) == BATCH
        others = [e.event_id for e in events if server_of(e.sender) != self._server_name]
        received = await self._store.get_received_pdu_origins(others) if others else {}
        by_destination: dict[str, list[QueuedPdu]] = {}
        newest: dict[tuple[str, str], DestinationRoom] = {}
        # The room's current ACL, read once per room and batch: a server it
        # denies is sent none of the room's events.
        acls: dict[str, Mapping[str, Any] | None] = {}
        to_send = [e for e in events if should_send(e, self._server_name, received.get(e.event_id))]
        # Each room's members now, then its membership changes since the
        # batch's start (read after, so they hold every change the members
        # reflect): who was joined before each event.
        current = {r: await self._joined_users(r) for r in sorted({e.room_id for e in to_send})}
        changes: dict[str, list[MemberChange]] = {}
        for change in await self._store.get_member_changes_after(current, self._position):
            changes.setdefault(change.room_id, []).append(change)
        for event in to_send:
            origin = received.get(event.event_id)
            if event.room_id not in acls:
                acls[event.room_id] = await room_acl(self._store, event.room_id)
            acl = acls[event.room_id]
            joined = joined_before(
                current[event.room_id], changes.get(event.room_id, []), event.stream_ordering
            )
            pdu = QueuedPdu(event.event_id, event.stream_ordering)
            for destination in destinations_of(event, joined, self._server_name, origin):
                if acl is not None and not server_allowed(acl, destination):
                    continue
                by_destination.setdefault(destination, []).append(pdu)
                newest[(destination, event.room_id)] = DestinationRoom(
                    destination, event.room_id, pdu
                )
        batch_upto = events[-1].stream_ordering if full else upto
        await self._passed(batch_upto, [newest[k] for k in sorted(newest)], by_destination)
        return full

    async def _passed(
        self,
        batch_upto: int,
        rows: list[DestinationRoom],
        by_destination: Mapping[str, list[QueuedPdu]],
    ) -> None:
        """The feed has looked at every event up to ``batch_upto``: record
        ``rows`` (each destination's newest event per room; sorted, so in
        one order in every sender's feed: the same rows, no deadlock) and,
        every so often, the position, before anything is queued (a
        destination is never sent an event that catch-up would not know of;
        failing, the batch is read again), then queue ``by_destination``'s
        PDUs past where this run's memory starts."""
        assert self._position is not None
        if rows or batch_upto - self._recorded_upto >= RECORD_POSITION_EVERY:
            await self._store.record_destination_rooms(rows, self._position, batch_upto)
            self._recorded_upto = batch_upto
        self._position = batch_upto
        progress = self._progress
        was_filled = progress.filled_past_live_from
        progress.filled_upto = max(progress.filled_upto or 0, self._position)
        live_from = progress.live_from
        assert live_from is not None
        for destination, pdus in sorted(by_destination.items()):
            if pdus[-1].stream_ordering > live_from:
                self._queue_pdus(destination, [p for p in pdus if p.stream_ordering > live_from])
        if not was_filled and progress.filled_past_live_from:
            self._filled()

    async def _nothing_to_send(self, position: int, upto: int) -> bool:
        """Whether the events after ``position`` up to ``upto`` certainly
        go to no other server, known from memory without reading them: this
        process has processed every writer's rows up to ``upto``, no room
        changed after ``position`` had a membership change, and every such
        room has only our users joined (so :func:`destinations_of` gives
        none). A server whose rooms are all local (the monolith under a
        benchmark) then reads no events per send. False when unsure."""
        if self._store.get_room_max_token().stream < upto:
            return False
        if len(self._store.room_changes) > MAX_ROOMS_WALKED:
            return False
        rooms = self._store.room_changes.changed_after(position)
        memberships = self._store.room_membership_changes.changed_after(position)
        if rooms is None or memberships is None or not rooms.isdisjoint(memberships):
            return False
        for room_id in sorted(rooms):
            joined = await self._joined_users(room_id)
            if any(server_of(user_id) != self._server_name for user_id in joined):
                return False
        return True

    async def _joined_users(self, room_id: str) -> frozenset[str]:
        """The room's joined users, read again only when its memberships
        may have changed since they were read (the store's change tracker),
        so a busy room costs no query per event."""
        cached = self._joined.get(room_id)
        changes = self._store.room_membership_changes
        if cached is not None and not changes.may_have_changed(room_id, cached[1]):
            return cached[0]
        token = self._store.get_room_max_token()
        users = await self._store.get_users_in_room(room_id)
        if len(self._joined) >= MAX_ROOMS_CACHED:
            self._joined.clear()
        self._joined[room_id] = (users, token)
        return users
