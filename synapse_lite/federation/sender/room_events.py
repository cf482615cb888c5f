"""Room events for other servers: which servers each event goes to, and the
PDUs the transactions carry (docs/federation.md, "Outbound: room events").

:class:`RoomEventsFeed` runs beside the sender. It follows the events
stream (every events writer's rows, and this process's own writes) from
the persisted-up-to position it found at start, reads the served events
(no rejected, soft-failed or outlier events) in stream order, and gives
each event that is ours to send to :func:`destinations_of`'s servers'
queues, in order.

Which events are ours to send (pure, :func:`should_send`): those our users
sent, and the membership events of other servers' users that reached us by
``send_join``/``send_leave`` (the joining server knows no one else in the
room: the spec has the resident server pass them on). Each goes to every
server with a user joined to the room now, and for a membership event to
the server of its target (a kicked or banned user's server hears of it),
never to us, to the server whose user sent it, nor to the server it came
from.

:class:`PduRenderer` gives the PDUs in the federation format, for
transactions and for every federation endpoint that serves events: ours
signed with our key (``ClientEventFormatter.federation_format``), other
servers' as they sent them (``received_pdus``); without ``unsigned``, and
without the ``event_id`` that versions 3 on must not carry.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from synapse_lite.api.identifiers import server_of
from synapse_lite.api.room_versions import EventIdFormat
from synapse_lite.event_graph.pdu import room_id_of_create

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
#: Rooms whose joined users the feed keeps (forgotten all at once beyond).
MAX_ROOMS_CACHED = 10_000
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


def destinations_of(
    event: Event, joined: Iterable[str], server_name: str, origin: str | None
) -> list[str]:
    """The servers ``event`` goes to: those of the ``joined`` users, and
    of a membership event's target; never us, the sender's server nor
    ``origin``. Sorted."""
    servers = {server_of(u) for u in joined}
    if event.type == "m.room.member" and event.state_key:
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

    async def pdus_by_id(self, event_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Those of ``event_ids`` we have, by id, in the server-server form:
        other servers' as they sent them, ours rendered and signed; without
        ``unsigned``, and from version 3 without ``event_id`` (which such
        PDUs must not carry: Synapse refuses them)."""
        ids = list(dict.fromkeys(event_ids))
        received = await self._store.get_received_pdus(ids)
        local_ids = [e for e in ids if e not in received]
        found = await self._store.get_events(local_ids) if local_ids else {}
        rendered = await self._formatter.federation_format(
            [found[e] for e in local_ids if e in found], self._clock.time_msec()
        )
        by_id: dict[str, dict[str, Any]] = {pdu["event_id"]: pdu for pdu in rendered}
        by_id.update(received)
        for event_id, pdu in by_id.items():
            # A version 12 create event has no ``room_id``: its id names the room.
            room_id = pdu.get("room_id") or room_id_of_create(event_id)
            version = await self._store.get_room_version(room_id)
            drop = {"unsigned"}
            if version.event_ids is not EventIdFormat.SERVER_SUFFIXED:
                drop.add("event_id")
            by_id[event_id] = {k: v for k, v in pdu.items() if k not in drop}
        return by_id

    async def transaction_pdus(self, event_ids: Sequence[str]) -> list[dict[str, Any]]:
        """The PDUs of a transaction (:meth:`pdus_by_id`), in the order
        given; events we no longer have are left out."""
        by_id = await self.pdus_by_id(event_ids)
        return [by_id[e] for e in event_ids if e in by_id]


class RoomEventsFeed:
    """Follows the events stream and queues each event for its servers
    (see the module docstring). Events persisted while no sender runs are
    not sent (the receivers fetch them when they next get a later event:
    ``get_missing_events``)."""

    def __init__(
        self,
        *,
        store: GenericWorkerStore,
        clock: Clock,
        server_name: str,
        queue_pdus: Callable[[str, Collection[str]], None],
        local_writes: ReplicationNotifier,
    ) -> None:
        """``queue_pdus(destination, event_ids)``: the sender's queue for
        a destination takes those events, in order."""
        self._store = store
        self._clock = clock
        self._server_name = server_name
        self._queue_pdus = queue_pdus
        self._position: int | None = None
        self._running = False
        self._again = False
        self._stopped = False
        #: room -> (its joined users, the position they are current at).
        self._joined: dict[str, tuple[frozenset[str], RoomStreamToken]] = {}
        local_writes.add_replication_callback(self.wake)

    def start(self) -> None:
        self._position = self._store.get_room_max_stream_ordering()
        self._stopped = False

    def stop(self) -> None:
        self._stopped = True

    def on_rows(self, writer: str, token: int, rows: Sequence[Any]) -> None:
        """Row hook of the events stream (rows another process wrote). It
        runs before this process's position moves past them: look once it
        has."""
        self._clock.call_later(0, self.wake)
        self.wake()

    def wake(self) -> None:
        """New events may be stored: look (cheap, safe to call spuriously)."""
        if self._position is None or self._stopped:
            return
        if self._running:
            self._again = True
            return
        self._running = True
        defer.ensureDeferred(self._run())

    async def _run(self) -> None:
        try:
            while True:
                self._again = False
                if not await self._take_batch():
                    if not self._again:
                        return
        except Exception:
            if not self._stopped:
                logger.exception("Reading room events for other servers failed")
        finally:
            self._running = False

    async def _take_batch(self) -> bool:
        """Queue the next events; whether there may be more."""
        assert self._position is not None
        upto = self._store.get_room_max_stream_ordering()
        if upto <= self._position:
            return False
        if await self._nothing_to_send(self._position, upto):
            self._position = upto
            return False
        events = await self._store.get_stream_events_between(self._position, upto, BATCH)
        full = len(events) == BATCH
        others = [e.event_id for e in events if server_of(e.sender) != self._server_name]
        received = await self._store.get_received_pdu_origins(others) if others else {}
        by_destination: dict[str, list[str]] = {}
        for event in events:
            origin = received.get(event.event_id)
            if not should_send(event, self._server_name, origin):
                continue
            joined = await self._joined_users(event.room_id)
            for destination in destinations_of(event, joined, self._server_name, origin):
                by_destination.setdefault(destination, []).append(event.event_id)
        for destination, event_ids in sorted(by_destination.items()):
            self._queue_pdus(destination, event_ids)
        self._position = events[-1].stream_ordering if full else upto
        return full

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
