"""Persisting events: the events writer's half of the events stream.

Everything an event changes is written in the one transaction that takes its
stream id: the event, the room's current state and its delta stream, memberships
(``room_memberships`` and, for local users, ``local_current_membership``), the
client's transaction id, the push actions of the users it notifies, its
full-text search entry (``search.py``), and the batched cache invalidation for
other processes.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.api.identifiers import server_of
from synapse_lite.api.room_versions import IMPLICIT_ROOM_VERSION, SPEC_ROOM_VERSIONS, RoomVersion
from synapse_lite.event_graph.pdu import StateKey
from synapse_lite.events import Event, EventContent, relation_of
from synapse_lite.storage._base import json_encoder
from synapse_lite.storage.caches import LruCache
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
    insert_rows_statements,
    insert_rows_txn,
)
from synapse_lite.storage.databases.main.auth_chains import (
    ChainedEvent,
    IndexedEvent,
    index_auth_chains_txn,
)
from synapse_lite.storage.databases.main.events_worker import (
    EventsWorkerStore,
    self_destruct_after,
)
from synapse_lite.storage.databases.main.inbound_pdu_queue import move_queued_to_received_txn
from synapse_lite.storage.databases.main.push_rules import PushOutcome, RecentPushOutcomes
from synapse_lite.storage.databases.main.search import index_events_txn
from synapse_lite.storage.databases.main.state_groups import (
    EVENT_GROUP_CACHE_ENTRIES,
    GroupRef,
    StateGroupsWorkerStore,
    group_after_id,
    group_before_id,
    groups_of_events_txn,
    resolve_states_txn,
    state_of_group_txn,
    write_state_group_txn,
)
from synapse_lite.storage.group_commit import GroupCommit
from synapse_lite.streams.catalog import EventsStreamCurrentStateRow, EventsStreamEventRow

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext

logger = logging.getLogger(__name__)

#: Ids whose rows a writer keeps for its streamer at most; beyond, it forgets
#: them all and reads them back from the database (nobody was sending them).
MAX_COMMITTED_IDS = 10_000


class CommittedRows:
    """The events stream rows this writer committed, kept from the commit
    until its streamer has sent them, so that sending a new event costs no
    query (issue 18: reading them back was a query per RDATA batch).

    Contract: the ID generator reports every id this process allocates
    (:meth:`allocated`), and ``persist_events`` records an id's rows at commit
    (:meth:`committed`), both before the id is marked finished (so before any
    position covers it). :meth:`rows` answers only when it holds every row of
    every id this process allocated in the range: an id without recorded rows
    (its transaction failed, or something other than ``persist_events`` took
    it), or ids forgotten after :data:`MAX_COMMITTED_IDS`, make it answer None
    and the caller reads the database, which is always right. Allocation
    happens on a database thread, the rest on the reactor: hence the lock.
    """

    def __init__(self, server_name: str) -> None:
        self._server_name = server_name
        self._lock = threading.Lock()
        #: Allocated ids whose rows are not recorded (in flight, or failed).
        self._unrecorded: set[int] = set()
        self._rows: dict[int, list[Any]] = {}
        #: Ids at or below it may have been forgotten.
        self._forgotten_upto = 0

    def allocated(self, stream_ids: Iterable[int]) -> None:
        with self._lock:
            self._unrecorded.update(stream_ids)

    def committed(
        self, events: Iterable[Event], rows_of: Mapping[int, list[Any]] | None = None
    ) -> None:
        """Record the rows of ``events``: :func:`stream_rows_of` each, or
        ``rows_of`` its stream id where given (a room whose current state
        was derived from its extremities, not event by event)."""
        with self._lock:
            for event in events:
                stream_id = event.stream_ordering
                self._unrecorded.discard(stream_id)
                given = rows_of.get(stream_id) if rows_of is not None else None
                self._rows[stream_id] = (
                    given if given is not None else stream_rows_of(event, self._server_name)
                )
            if len(self._rows) + len(self._unrecorded) > MAX_COMMITTED_IDS:
                self._forgotten_upto = max(self._rows.keys() | self._unrecorded)
                self._rows.clear()
                self._unrecorded.clear()

    def rows(self, after: int, upto: int) -> list[tuple[int, Any]] | None:
        """This process's rows in ``(after, upto]``, oldest first, or None
        if they are not all here. Forgets the ids at or below ``after``
        (sent: the streamer asks from its last sent position)."""
        with self._lock:
            if after > self._forgotten_upto:
                # Ids of ours at or below the streamer's position are finished:
                # sent, or (unrecorded) failed.
                for stream_id in [i for i in self._rows if i <= after]:
                    del self._rows[stream_id]
                self._unrecorded = {i for i in self._unrecorded if i > after}
                self._forgotten_upto = after
            if after < self._forgotten_upto or any(i <= upto for i in self._unrecorded):
                return None
            ids = sorted(i for i in self._rows if i <= upto)
            return [(i, row) for i in ids for row in self._rows[i]]


def stream_rows_of(event: Event, server_name: str) -> list[Any]:
    """What the events stream carries for a newly persisted event of a
    server named ``server_name``: its row, then its current-state row (as
    ``get_events_stream_updates`` reads them)."""
    rows = [event_row_of(event, server_name)]
    if event.state_key is not None and not (event.rejected or event.soft_failed or event.outlier):
        rows.append(
            EventsStreamCurrentStateRow(
                room_id=event.room_id,
                type=event.type,
                state_key=event.state_key,
                event_id=event.event_id,
            )
        )
    return rows


def event_row_of(event: Event, server_name: str) -> Any:
    """The events stream's row of the event itself, persisted by the server
    named ``server_name``."""
    return EventsStreamEventRow(
        event_id=event.event_id,
        room_id=event.room_id,
        type=event.type,
        state_key=event.state_key,
        redacts=event.redacts,
        relates_to=relation[0] if (relation := relation_of(event.content)) else None,
        membership=event.membership,
        rejected=event.rejected,
        outlier=bool(event.outlier),
        local=server_of(event.sender) == server_name,
    )


class DuplicateTransactionError(Exception):
    """A send with the same (user, device, txn id) was persisted concurrently."""

    def __init__(self, event_id: str) -> None:
        super().__init__(event_id)
        self.event_id = event_id


#: An event's state groups: (before it, after it); None where unknown (an
#: outlier) or, before a create event, empty.
EventGroups = tuple[int | None, int | None]


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RemoteJoinToPersist:
    """What :meth:`EventsStore.persist_remote_join` needs besides the events:
    the room's row (for a room new here), the state before the join, and
    the received form of every event (id -> PDU) with the server it came
    from."""

    room_id: str
    room_version: str
    creator: str
    creation_ts: int
    origin: str
    state_before: Mapping[StateKey, str]
    pdus: Mapping[str, dict[str, Any]]


class EventsStore(StateGroupsWorkerStore, EventsWorkerStore):
    """Writes events. Only an events writer may call these (the ID generator
    refuses anyone else)."""

    #: Set by ``PushRulesWorkerStore`` beside it on the sole events writer.
    push_outcomes: RecentPushOutcomes | None = None

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ) -> None:
        super().__init__(database, db_conn, hs)
        # The auth chain positions of events this writer indexed or read
        # (the auth events of its next state events).
        self._auth_positions: LruCache[IndexedEvent] = LruCache(EVENT_GROUP_CACHE_ENTRIES)
        # Ids of the backfill stream (stored ids count down from -1).
        self._backfill_id_gen = hs.id_generators.of("backfill")
        # Kept only where a streamer sends them (a layout with workers).
        self._committed_rows = CommittedRows(self.server_name) if hs.config.workers else None
        # Where writes wait for one another anyway (SQLite), the persists
        # that queued behind a transaction go in one (``group_commit.py``).
        self._persist_group: GroupCommit[list[Event]] | None = (
            GroupCommit(database, "persist_events", idempotent=True)
            if database.engine.writes_one_at_a_time
            else None
        )
        if self._committed_rows is not None:
            # Every id, whoever takes it: one taken outside persist_events has
            # no rows here and sends the streamer to the database.
            self._stream_id_gen.on_allocation(self._committed_rows.allocated)

    async def get_events_stream_updates(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[int, Any]], int, bool]:
        """As the worker store's, from memory when the rows are this
        process's and all still here (see :class:`CommittedRows`)."""
        if instance_name == self._instance_name and self._committed_rows is not None:
            rows = self._committed_rows.rows(last_id, current_id)
            if rows is not None:
                return rows, current_id, False
        return await super().get_events_stream_updates(instance_name, last_id, current_id, limit)

    async def get_state_ids_before_received(
        self,
        room_id: str,
        prev_event_ids: Sequence[str],
        given_states: Sequence[Mapping[StateKey, str]] = (),
    ) -> dict[StateKey, str] | None:
        """The state before an event whose parents are ``prev_event_ids``
        (on the room's writer, about to persist it): the state after its
        one parent, or the resolution of its parents' states (the room
        version's algorithm, as the persist transaction will store it).
        None when a parent is unknown or has no state (an outlier), unless
        ``given_states`` stand for those: the states after parents we do
        not have, as another server told them (``/state_ids``), resolved
        with the states after the parents we have."""

        def txn_func(txn: LoggingTransaction) -> dict[StateKey, str] | None:
            wanted = sorted(set(prev_event_ids))
            groups = groups_of_events_txn(txn, wanted)
            if len(groups) < len(wanted) and not given_states:
                return None
            distinct = sorted({g.id: g for g in groups.values()}.values(), key=lambda g: g.id)
            if not given_states:
                if len(distinct) == 1:
                    return state_of_group_txn(txn, distinct[0].id)
                return self._resolve_groups_txn(txn, room_id, distinct)[0]
            states = [state_of_group_txn(txn, g.id) for g in distinct]
            states.extend(dict(s) for s in given_states)
            unique = list({tuple(sorted(s.items())): s for s in states}.values())
            if len(unique) == 1:
                return dict(unique[0])
            return resolve_states_txn(txn, self._room_version_txn(txn, room_id), unique)

        return await self.db_pool.runInteraction("get_state_ids_before_received", txn_func)

    async def persist_events(
        self,
        events: list[EventContent],
        push_actions: Mapping[str, Any] | None = None,
        given_state_before: Mapping[str, Mapping[StateKey, str]] | None = None,
        from_inbound_queue: Sequence[str] = (),
    ) -> list[Event]:
        """Persist events in order, in one transaction; returns them with their
        stream ids. Where writes run one at a time (SQLite), that transaction
        may also hold the events of other calls queued meanwhile (other
        rooms: a room's writer persists one batch of a room at a time), each
        call with its own stream ids and its own failure
        (:class:`GroupCommit`). ``push_actions``: event_id -> what it does for local
        members (``handlers.push.EventPushActions``), stored in the same
        transaction. ``given_state_before``: event_id -> the state before
        it where its parents' states do not say it (a received event whose
        missing parents' states another server gave). ``from_inbound_queue``:
        ids of these events taken from the durable inbound queue, whose
        queued rows become their ``received_pdus`` rows in the same
        transaction (persisted and dequeued together, or neither). Raises
        :class:`DuplicateTransactionError` if a client's transaction id was
        used meanwhile."""

        def txn_func(txn: LoggingTransaction) -> list[Event]:
            move_queued_to_received_txn(txn, from_inbound_queue)
            return self._persist_events_txn(txn, events, push_actions or {}, given_state_before)

        # A second run after a COMMIT of unknown outcome cannot store an event
        # twice: event ids and client transaction ids are unique keys.
        if self._persist_group is not None:
            # Sends to other rooms queued meanwhile share the transaction.
            persisted = await self._persist_group.run(txn_func)
        else:
            persisted = await self.db_pool.runInteraction(
                "persist_events", txn_func, idempotent=True
            )
        return persisted

    async def delete_forward_extremities_but(self, room_id: str, keep: str) -> int:
        """Delete the room's forward extremities but ``keep``; how many went.
        For the room's writer, holding the room's lock (the admin API): the
        current state stays as it is (the next event's state is resolved
        from its parents)."""

        def txn_func(txn: LoggingTransaction) -> int:
            txn.execute(
                "DELETE FROM event_forward_extremities WHERE room_id = ? AND event_id != ?",
                (room_id, keep),
            )
            return max(txn.rowcount, 0)

        return await self.db_pool.runInteraction("delete_forward_extremities_but", txn_func)

    async def persist_remote_join(
        self,
        join: RemoteJoinToPersist,
        outliers: list[EventContent],
        content: EventContent,
    ) -> Event:
        """Persist our user's join to another server's room (docs/federation.md,
        "Joining rooms of other servers"), in one transaction: the room's row
        (created with this writer as its writer when the room is new here),
        ``outliers`` (the answer's state and auth chain, checked by the
        caller, those not stored yet), the received forms of all of them, and
        the join ``content`` with ``join.state_before`` as the state before
        it (a snapshot group). The join becomes the room's one forward
        extremity (the room's old ones, from an earlier stay, are dropped: the
        resident server's state is the room's now), and the current state is
        the state after it."""

        def txn_func(txn: LoggingTransaction) -> list[Event]:
            txn.execute(
                "INSERT INTO rooms (room_id, creator, is_public, room_version, creation_ts,"
                " event_writer) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (room_id) DO NOTHING",
                (join.room_id, join.creator, False, join.room_version, join.creation_ts,
                 self._instance_name),
            )  # fmt: skip
            txn.execute("DELETE FROM event_forward_extremities WHERE room_id = ?", (join.room_id,))
            txn.execute_batch(
                "INSERT INTO received_pdus (event_id, room_id, origin, pdu_json)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING",
                [
                    (event_id, join.room_id, join.origin, json_encoder(pdu))
                    for event_id, pdu in sorted(join.pdus.items())
                ],
            )
            return self._persist_events_txn(
                txn, [*outliers, content], {}, {content.event_id: join.state_before}
            )

        persisted = await self.db_pool.runInteraction(
            "persist_remote_join", txn_func, idempotent=False
        )
        return persisted[-1]

    async def persist_backfilled_events(
        self, room_id: str, origin: str, events: Sequence[tuple[EventContent, dict[str, Any]]]
    ) -> list[Event]:
        """Persist history another server gave by ``/backfill``
        (docs/federation.md, "Backfill"), in one transaction: each event
        (checked by the caller against its own auth events; its received
        form beside it) on the **backfill stream**, whose stored ids count
        down, deepest first, so the room's stream order reads them before
        everything already held and, among them, by depth. They are in the
        graph (edges) without state groups, and move no forward extremity,
        current state nor room row (old history changes nothing of now).
        Events stored meanwhile by another path are left out of what is
        stored and returned."""
        if not events:
            return []
        ordered = sorted(events, key=lambda e: (-e[0].depth, -e[0].origin_server_ts))

        def txn_func(txn: LoggingTransaction) -> list[Event]:
            # The caller checked which events are new before this
            # transaction; the room's inbound PDUs (get_missing_events, a
            # state gap) may have stored some since: those are left out.
            marks = ", ".join("?" for _ in ordered)
            txn.execute(
                f"SELECT event_id FROM events WHERE event_id IN ({marks})",
                [c.event_id for c, _ in ordered],
            )
            held = {row[0] for row in txn.fetchall()}
            new = [(c, pdu) for c, pdu in ordered if c.event_id not in held]
            if not new:
                return []
            contents = [c for c, _ in new]
            txn.execute_batch(
                "INSERT INTO received_pdus (event_id, room_id, origin, pdu_json)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING",
                [(c.event_id, room_id, origin, json_encoder(pdu)) for c, pdu in new],
            )
            # Counting down: the deepest event gets the id nearest zero.
            stream_ids = self._backfill_id_gen.get_next_mult_txn(txn, len(contents))
            insert_rows_txn(
                txn,
                "event_edges (event_id, prev_event_id)",
                [(c.event_id, prev) for c in contents for prev in c.prev_event_ids],
            )
            insert_rows_txn(
                txn,
                "event_auth_edges (event_id, auth_id)",
                [(c.event_id, auth) for c in contents for auth in c.auth_event_ids],
            )
            self._index_auth_chains_txn(txn, contents, stream_ids)
            persisted = [
                self._stored(c, stream_id)
                for c, stream_id in zip(contents, stream_ids, strict=True)
            ]
            self._insert_events_txn(txn, persisted, {}, {}, backfilled=True)
            index_events_txn(txn, persisted)
            for event in persisted:
                txn.call_after(self.invalidate_caches_for_event, event.event_id, event.redacts)
            return persisted

        # Not cached: history comes after its redactions (the first read of
        # an event applies them; ``_cache_persisted``).
        return await self.db_pool.runInteraction(
            "persist_backfilled_events", txn_func, idempotent=False
        )

    async def persist_remote_invite(
        self, content: EventContent, origin: str, pdu: dict[str, Any], room_version: str
    ) -> Event:
        """Persist another server's invite of our user to a room we may not
        have (docs/federation.md, "Invites across servers"): an outlier
        whose membership is our user's (current state, memberships, the
        delta stream, so /sync shows the invite), with its received form
        ``pdu`` (its ``unsigned.invite_room_state`` is the stripped state
        shown with it). A room new here gets its row, with ``room_version``
        (as the reference server does for such memberships): its version is
        then known, and this writer is its writer."""

        def txn_func(txn: LoggingTransaction) -> list[Event]:
            txn.execute(
                "INSERT INTO rooms (room_id, creator, is_public, room_version, creation_ts,"
                " event_writer) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (room_id) DO NOTHING",
                (content.room_id, content.sender, False, room_version,
                 content.origin_server_ts, self._instance_name),
            )  # fmt: skip
            txn.execute(
                "INSERT INTO received_pdus (event_id, room_id, origin, pdu_json)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING",
                (content.event_id, content.room_id, origin, json_encoder(pdu)),
            )
            return self._persist_events_txn(
                txn, [content], {}, member_outliers=frozenset([content.event_id])
            )

        [event] = await self.db_pool.runInteraction("persist_remote_invite", txn_func)
        return event

    def _cache_persisted(self, persisted: list[Event], redacted: set[str]) -> None:
        """Cache, as read, the events just persisted that have no redaction:
        not among ``redacted`` (another server's events with a redaction
        stored before them, or with them: a server may send a redaction
        first) and not dropped since by a redaction (one can come first when
        a room changes writers). Those are left to their first read, which
        applies the redactions."""
        forgotten = self._unredacted_events.forgotten
        for event in persisted:
            if event.event_id not in redacted and not forgotten(event.event_id):
                self._event_cache.set(event.event_id, event)

    def _persist_events_txn(
        self,
        txn: LoggingTransaction,
        events: list[EventContent],
        push_actions: Mapping[str, Any],
        given_state_before: Mapping[str, Mapping[StateKey, str]] | None = None,
        member_outliers: frozenset[str] = frozenset(),
    ) -> list[Event]:
        persisted: list[Event] = []
        # Registered before the ids are taken, so it runs (after commit) before
        # they finish and the positions covering these events become visible.
        # Rooms that may have branched or merged (see below), and the events
        # stream rows of their events (their state rows are not the events'
        # own): stream id -> rows.
        resolved_rooms: set[str] = set()
        resolved_rows: dict[int, list[Any]] = {}
        txn.call_after(self._record_persisted_positions, persisted, resolved_rows)
        if self.push_outcomes is not None:
            txn.call_after(self._remember_push_outcomes, persisted, push_actions)
        stream_ids = self._stream_id_gen.get_next_mult_txn(txn, len(events))
        # Recorded last: a client's transaction id is the statement whose
        # row count is read, so the rows held for later go in its round trip.
        txn_keys: list[tuple[tuple[str, str, str], Event]] = []
        members_changed: dict[str, set[str]] = defaultdict(set)
        state_changed: set[str] = set()
        groups = self._state_groups_txn(txn, events, stream_ids, given_state_before or {})
        # Rooms that may have several forward extremities after the batch
        # (a branch, or a merge): their current state is derived from the
        # states at the extremities once the batch is in, not event by event.
        resolved_rooms.update(self._insert_graph_txn(txn, events))
        self._index_auth_chains_txn(txn, events, stream_ids)
        for content, stream_id in zip(events, stream_ids, strict=True):
            room_id = content.room_id
            event = self._stored(content, stream_id)
            if content.rejected_reason is not None:
                txn.execute(
                    "INSERT INTO rejections (event_id, reason, rejected_ts) VALUES (?, ?, ?)",
                    (content.event_id, content.rejected_reason, self.clock.time_msec()),
                )
            if content.txn_key is not None:
                txn_keys.append((content.txn_key, event))
            txn.call_after(self._txn_keys_by_event.set, event.event_id, content.txn_key)
            expiry = self_destruct_after(event.content) if self._self_destructing else None
            if expiry is not None:
                txn.execute(
                    "INSERT INTO event_expiry (event_id, expiry_ts) VALUES (?, ?)",
                    (event.event_id, expiry),
                )
            # A rejected, soft-failed or outlier state event changes no
            # current state, membership or room row (docs/event-graph.md).
            # An invite from another server to a room we do not have is an
            # outlier whose membership is our user's all the same.
            if event.is_state and (content.in_room or content.event_id in member_outliers):
                state_changed.add(room_id)
                if event.type == "m.room.member" and event.state_key is not None:
                    members_changed[room_id].add(event.state_key)
                self._update_current_state_txn(txn, event, current=room_id not in resolved_rooms)
            txn.call_after(self.invalidate_caches_for_event, event.event_id, event.redacts)
            persisted.append(event)
        self._insert_events_txn(txn, persisted, push_actions, groups)
        for event in persisted:
            if event.room_id in resolved_rooms:
                resolved_rows[event.stream_ordering] = [event_row_of(event, self.server_name)]
            elif event.event_id in member_outliers:
                resolved_rows[event.stream_ordering] = [
                    event_row_of(event, self.server_name),
                    EventsStreamCurrentStateRow(
                        room_id=event.room_id,
                        type=event.type,
                        state_key=event.state_key or "",
                        event_id=event.event_id,
                    ),
                ]
        for room_id in sorted(resolved_rooms):
            changed = self._current_state_from_extremities_txn(
                txn, room_id, persisted, resolved_rows
            )
            if changed:
                state_changed.add(room_id)
                members_changed[room_id].update(k for t, k in changed if t == "m.room.member")
        served = [e for e in persisted if e.served]
        self._insert_push_actions_txn(txn, served, push_actions)
        index_events_txn(txn, served)
        for txn_key, event in txn_keys:
            self._record_txn_id_txn(txn, txn_key, event)
        # Nobody can redact our events before they exist; another server's
        # redaction may have come first (or in this batch).
        others = [e.event_id for e in persisted if not self.hs.is_mine_id(e.sender)]
        redacted = set(self._redactions_of_txn(txn, others)) if others else set()
        txn.call_after(self._cache_persisted, persisted, redacted)
        # Other processes learn of state changes from this transaction's rows
        # on the events stream (no caches-stream rows needed).
        for room_id in sorted(state_changed):
            txn.call_after(self.invalidate_state_caches, room_id, members_changed[room_id])
        return persisted

    def _stored(self, content: EventContent, stream_id: int) -> Event:
        """``content`` as persisted here at ``stream_id``."""
        return Event(
            event_id=content.event_id,
            room_id=content.room_id,
            type=content.type,
            state_key=content.state_key,
            sender=content.sender,
            content=content.content,
            origin_server_ts=content.origin_server_ts,
            stream_ordering=stream_id,
            depth=content.depth,
            instance_name=self._instance_name,
            redacts=content.redacts,
            outlier=content.outlier,
            rejected=content.rejected_reason is not None,
            soft_failed=content.soft_failed,
        )

    def _record_persisted_positions(
        self, persisted: list[Event], resolved_rows: Mapping[int, list[Any]]
    ) -> None:
        if self._committed_rows is not None:
            self._committed_rows.committed(persisted, resolved_rows)
        recent = self.recent_room_events
        for event in persisted:
            self.record_event_position(
                event.room_id, event.type, event.state_key, event.instance_name,
                event.stream_ordering,
            )  # fmt: skip
            if event.served and event.stream_ordering > 0:
                recent.record(
                    event.room_id, event.instance_name, event.stream_ordering, event.event_id
                )
        for stream_id, rows in resolved_rows.items():
            for row in rows:
                if isinstance(row, EventsStreamCurrentStateRow) and row.type == "m.room.member":
                    self.record_membership_position(
                        row.room_id, row.state_key, self._instance_name, stream_id
                    )

    def _remember_push_outcomes(
        self, persisted: list[Event], push_actions: Mapping[str, Any]
    ) -> None:
        """What ``persisted`` count in unread counts, for the sole writer's
        memory (``RecentPushOutcomes``): the same outcomes its rows got."""
        assert self.push_outcomes is not None
        for event in persisted:
            actions = push_actions.get(event.event_id)
            if actions is None or not event.served:
                continue
            own = {
                user_id: (notifies, highlights)
                for user_id, (_, notifies, highlights) in actions.exceptions.items()
            }
            if actions.default is None and not own:
                continue
            self.push_outcomes.persisted(
                event.room_id,
                PushOutcome(
                    stream_ordering=event.stream_ordering,
                    sender=event.sender,
                    default_highlight=None if actions.default is None else actions.default[1],
                    own=own,
                ),
            )

    def _record_txn_id_txn(
        self, txn: LoggingTransaction, txn_key: tuple[str, str, str], event: Event
    ) -> None:
        user_id, device_id, txn_id = txn_key
        txn.execute(
            "INSERT INTO event_txn_ids (user_id, device_id, txn_id, room_id, event_id, inserted_ts)"
            " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (user_id, device_id, txn_id) DO NOTHING",
            (user_id, device_id, txn_id, event.room_id, event.event_id, self.clock.time_msec()),
        )
        if txn.rowcount == 0:
            txn.execute(
                "SELECT event_id FROM event_txn_ids"
                " WHERE user_id = ? AND device_id = ? AND txn_id = ?",
                (user_id, device_id, txn_id),
            )
            row = txn.fetchone()
            raise DuplicateTransactionError(row[0] if row else "")

    def _insert_events_txn(
        self,
        txn: LoggingTransaction,
        events: list[Event],
        push_actions: Mapping[str, Any],
        groups: Mapping[str, EventGroups],
        backfilled: bool = False,
    ) -> None:
        """``backfilled``: old history (``persist_backfilled_events``),
        which changes no room row (an old join rule is not the room's now).
        """
        # Sent with the transaction's next statement (on PostgreSQL in its
        # round trip). An event's default push actions ride on its row (no
        # extra statement).
        defaults = {}
        for event_id, actions in push_actions.items():
            if actions.default is not None:
                defaults[event_id] = (json_encoder(actions.default[0]), actions.default[1])
        txn.execute_later(
            "INSERT INTO events (stream_ordering, topological_ordering, event_id, room_id, type,"
            " state_key, sender, origin_server_ts, content, redacts, membership, outlier,"
            " instance_name, push_actions, push_highlight, state_group_before, state_group,"
            " rejected, soft_failed)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    event.stream_ordering,
                    event.depth,
                    event.event_id,
                    event.room_id,
                    event.type,
                    event.state_key,
                    event.sender,
                    event.origin_server_ts,
                    json_encoder(event.content),
                    event.redacts,
                    event.membership,
                    event.outlier,
                    event.instance_name,
                    *(defaults.get(event.event_id, (None, None)) if event.served else (None, None)),
                    *groups.get(event.event_id, (None, None)),
                    event.rejected,
                    event.soft_failed,
                )
                for event in events
            ],
        )
        served = [e for e in events if e.served]
        for event in [] if backfilled else served:
            self._update_room_row_txn(txn, event)
        relations = [(e, r) for e in served if (r := relation_of(e.content)) is not None]
        if relations:
            txn.call_after(self.childless_events.related_to, [r[0] for _, r in relations])
            txn.execute_later(
                "INSERT INTO event_relations (event_id, relates_to_id, relation_type, room_id,"
                " sender, type, stream_ordering) VALUES (?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (event_id) DO NOTHING",
                [
                    (e.event_id, parent, rel_type, e.room_id, e.sender, e.type, e.stream_ordering)
                    for e, (parent, rel_type) in relations
                ],
            )

    def _insert_graph_txn(self, txn: LoggingTransaction, events: list[EventContent]) -> set[str]:
        """The events' edges, and the rooms' forward extremities after them:
        their parents stop being extremities, and each event no later
        event of the batch names becomes one. Returns the rooms that may now
        have more than one extremity (not those whose one extremity moved).

        Few statements (issue 30's send drop was a round trip and a
        driver-side statement per row): each edge table takes one multi-row
        INSERT per batch, and a room whose batch has one outside parent and
        one new extremity (every linear send) moves its extremity with one
        UPDATE; only parents outside the batch are deleted (the batch's own
        events never were extremities)."""
        # The edges ride in one round trip with the first extremity move
        # (PostgreSQL; SQLite has no round trips to save).
        edges = insert_rows_statements(
            "event_edges (event_id, prev_event_id)",
            [(e.event_id, prev) for e in events for prev in e.prev_event_ids],
        ) + insert_rows_statements(
            "event_auth_edges (event_id, auth_id)",
            [(e.event_id, auth) for e in events for auth in e.auth_event_ids],
        )
        # Rejected, soft-failed and outlier events have their edges but move
        # no extremity: new local events never name them as parents, and
        # their parents stay extremities.
        events = [e for e in events if e.in_room]
        in_batch = {e.event_id for e in events}
        parents = {prev for e in events for prev in e.prev_event_ids}
        gone: dict[str, set[str]] = defaultdict(set)
        new: dict[str, list[str]] = defaultdict(list)
        for e in events:
            gone[e.room_id].update(p for p in e.prev_event_ids if p not in in_batch)
            if e.event_id not in parents:
                new[e.room_id].append(e.event_id)
        deletes: list[tuple[str, str]] = []
        inserts: list[tuple[str, str]] = []
        maybe_branched: set[str] = set()
        for room_id in sorted(gone.keys() | new.keys()):
            old, added = sorted(gone[room_id]), new[room_id]
            if len(old) == 1 and len(added) == 1:
                txn.execute_statements(
                    [
                        *edges,
                        (
                            "UPDATE event_forward_extremities SET event_id = ?"
                            " WHERE room_id = ? AND event_id = ?",
                            (added[0], room_id, old[0]),
                        ),
                    ]
                )
                edges = []
                if txn.rowcount == 1:
                    # The line went on from an extremity. Had the room
                    # others, the writer named them all, so this one
                    # replaced its only one.
                    continue
                # The parent was no extremity (already superseded): add ours.
                inserts.append((room_id, added[0]))
                maybe_branched.add(room_id)
                continue
            if not old and len(added) == 1:
                # A new room (its batch starts with the create event): one
                # line, its last event the only extremity.
                inserts.append((room_id, added[0]))
                continue
            deletes.extend((room_id, event_id) for event_id in old)
            inserts.extend((room_id, event_id) for event_id in added)
            maybe_branched.add(room_id)
        txn.execute_statements(edges)
        if deletes:
            txn.execute_batch(
                "DELETE FROM event_forward_extremities WHERE room_id = ? AND event_id = ?",
                deletes,
            )
        insert_rows_txn(txn, "event_forward_extremities (room_id, event_id)", inserts)
        return maybe_branched

    def _state_groups_txn(
        self,
        txn: LoggingTransaction,
        events: list[EventContent],
        stream_ids: Sequence[int],
        given_state_before: Mapping[str, Mapping[StateKey, str]],
    ) -> dict[str, EventGroups]:
        """The state groups before and after each event, writing the new
        ones: an event with one parent state (every linear send) has that
        group before it and, a message, after it too (no row written); a
        state event adds a one-key delta; parents with different states
        are resolved (the core's ``resolve_state``) into a group of their
        own. Parents' groups come from memory (this writer persisted them),
        else one query."""
        in_batch: dict[str, GroupRef | None] = {}
        outside = sorted(
            {p for e in events for p in e.prev_event_ids} - {e.event_id for e in events}
        )
        known: dict[str, GroupRef] = {}
        missing = []
        for parent in outside:
            found, ref = self._event_group.get(parent)
            if found and ref is not None:
                known[parent] = ref
            else:
                missing.append(parent)
        if missing:
            known.update(groups_of_events_txn(txn, missing))
        result: dict[str, EventGroups] = {}
        for content, stream_id in zip(events, stream_ids, strict=True):
            parent_groups = {
                ref.id: ref
                for p in content.prev_event_ids
                if (ref := in_batch[p] if p in in_batch else known.get(p)) is not None
            }
            before: GroupRef | None
            if content.outlier:
                # Known without the state before it: no groups.
                in_batch[content.event_id] = None
                result[content.event_id] = (None, None)
                continue
            given = given_state_before.get(content.event_id)
            if given is not None:
                # Told by another server (a remote join's state): a snapshot.
                before = write_state_group_txn(
                    txn, content.room_id, group_before_id(stream_id), None, given,
                    partial(dict, given),
                )  # fmt: skip
            elif len(parent_groups) == 1:
                before = next(iter(parent_groups.values()))
            elif parent_groups:
                before = self._resolve_parent_groups_txn(
                    txn, content.room_id, sorted(parent_groups.values(), key=lambda g: g.id),
                    group_before_id(stream_id),
                )  # fmt: skip
            elif content.prev_event_ids:
                # No parent's state is known (outliers): nor is this one's.
                in_batch[content.event_id] = None
                result[content.event_id] = (None, None)
                continue
            else:
                before = None  # a create event: the empty state
            after = before
            # A rejected event changes no state: its state after is its state
            # before (a soft-failed one is in the graph and its state).
            if content.state_key is not None and content.rejected_reason is None:
                key = (content.type, content.state_key)

                after = write_state_group_txn(
                    txn,
                    content.room_id,
                    group_after_id(stream_id),
                    before,
                    {key: content.event_id},
                    partial(_state_with, txn, before, key, content.event_id),
                )
            in_batch[content.event_id] = after
            result[content.event_id] = (
                before.id if before else None,
                after.id if after else None,
            )
        txn.call_after(self._remember_event_groups, in_batch)
        return result

    def _index_auth_chains_txn(
        self, txn: LoggingTransaction, events: list[EventContent], stream_ids: Sequence[int]
    ) -> None:
        """The batch's state events into the auth chain index, their auth
        events' positions from memory where this writer has them (it is the
        only one extending its rooms' chains)."""
        chained = [
            ChainedEvent(e.event_id, e.room_id, (e.type, e.state_key), e.auth_event_ids, sid)
            for e, sid in zip(events, stream_ids, strict=True)
            if e.state_key is not None
        ]
        if not chained:
            return
        cached = {}
        for event in chained:
            for auth_id in event.auth_event_ids:
                found, entry = self._auth_positions.get(auth_id)
                if found and entry is not None:
                    cached[auth_id] = entry
        touched = index_auth_chains_txn(txn, chained, cached)
        txn.call_after(self._remember_auth_positions, touched)

    def _remember_auth_positions(self, entries: Mapping[str, IndexedEvent]) -> None:
        for event_id, entry in entries.items():
            self._auth_positions.set(event_id, entry)

    def _remember_event_groups(self, groups: Mapping[str, GroupRef | None]) -> None:
        for event_id, ref in groups.items():
            if ref is not None:
                self._event_group.set(event_id, ref)

    def _resolve_groups_txn(
        self, txn: LoggingTransaction, room_id: str, groups: Sequence[GroupRef]
    ) -> tuple[dict[StateKey, str], list[dict[StateKey, str]]]:
        """The resolution of the states of ``groups`` (by the room's
        version's algorithm), and those states."""
        states = [state_of_group_txn(txn, g.id) for g in groups]
        return resolve_states_txn(txn, self._room_version_txn(txn, room_id), states), states

    def _room_version_txn(self, txn: LoggingTransaction, room_id: str) -> RoomVersion:
        txn.execute("SELECT room_version FROM rooms WHERE room_id = ?", (room_id,))
        row = txn.fetchone()
        return SPEC_ROOM_VERSIONS.get(str(row[0]) if row else "", IMPLICIT_ROOM_VERSION)

    def _resolve_parent_groups_txn(
        self, txn: LoggingTransaction, room_id: str, groups: Sequence[GroupRef], group_id: int
    ) -> GroupRef:
        """Store the resolved state of the parents' ``groups`` as group
        ``group_id``, a delta against the parent state it differs least
        from."""
        resolved, states = self._resolve_groups_txn(txn, room_id, groups)
        best = min(
            range(len(groups)),
            key=lambda i: (sum(1 for k, v in resolved.items() if states[i].get(k) != v), i),
        )
        base = states[best]
        changes = {k: v for k, v in resolved.items() if base.get(k) != v}
        removes = any(k not in resolved for k in base)
        return write_state_group_txn(
            txn, room_id, group_id, groups[best], changes, lambda: resolved, removes
        )

    def _current_state_from_extremities_txn(
        self,
        txn: LoggingTransaction,
        room_id: str,
        persisted: Sequence[Event],
        stream_rows: dict[int, list[Any]],
    ) -> list[StateKey]:
        """Make the room's ``current_state_events`` the state at its forward
        extremities after the batch: the state after the one extremity, or
        the resolution of the states after several (the core's
        ``resolve_state``). Each changed key gets one delta stream row, with
        the stream id of the room's last event of the batch (added to that
        id's ``stream_rows``, as the events stream reads them back). Returns
        the changed keys."""
        txn.execute("SELECT event_id FROM event_forward_extremities WHERE room_id = ?", (room_id,))
        extremities = sorted(str(row[0]) for row in txn.fetchall())
        groups = groups_of_events_txn(txn, extremities)
        distinct = sorted({g.id: g for g in groups.values()}.values(), key=lambda g: g.id)
        if not distinct:
            return []
        if len(distinct) == 1:
            target = state_of_group_txn(txn, distinct[0].id)
        else:
            target, _states = self._resolve_groups_txn(txn, room_id, distinct)
        txn.execute(
            "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?",
            (room_id,),
        )
        current = {(str(t), str(k)): str(e) for t, k, e in txn.fetchall()}
        changed = sorted(
            key for key in current.keys() | target.keys() if current.get(key) != target.get(key)
        )
        if not changed:
            return []
        stream_id = max(e.stream_ordering for e in persisted if e.room_id == room_id)
        new_ids = sorted({target[k] for k in changed if k in target})
        memberships: dict[str, tuple[str | None, int]] = {}
        for start in range(0, len(new_ids), 500):
            chunk = new_ids[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            txn.execute(
                "SELECT event_id, membership, stream_ordering FROM events"
                f" WHERE event_id IN ({marks})",
                chunk,
            )
            for event_id, membership, ordering in txn.fetchall():
                memberships[str(event_id)] = (membership, int(ordering))
        if len(extremities) > 1:
            logger.info(
                "Current state of %s resolved from %d forward extremities: %d keys changed",
                room_id, len(extremities), len(changed),
            )  # fmt: skip
        for type_, state_key in changed:
            event_id = target.get((type_, state_key))
            prev_event_id = current.get((type_, state_key))
            membership, ordering = memberships.get(event_id or "", (None, stream_id))
            if event_id is None:
                txn.execute(
                    "DELETE FROM current_state_events"
                    " WHERE room_id = ? AND type = ? AND state_key = ?",
                    (room_id, type_, state_key),
                )
            else:
                txn.execute(
                    "INSERT INTO current_state_events (room_id, type, state_key, event_id,"
                    " membership) VALUES (?, ?, ?, ?, ?) ON CONFLICT (room_id, type, state_key)"
                    " DO UPDATE SET event_id = EXCLUDED.event_id,"
                    " membership = EXCLUDED.membership",
                    (room_id, type_, state_key, event_id, membership),
                )
            txn.execute(
                "INSERT INTO current_state_delta_stream (stream_id, instance_name, room_id, type,"
                " state_key, event_id, prev_event_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (stream_id, self._instance_name, room_id, type_, state_key, event_id,
                 prev_event_id),
            )  # fmt: skip
            stream_rows.setdefault(stream_id, []).append(
                EventsStreamCurrentStateRow(
                    room_id=room_id, type=type_, state_key=state_key, event_id=event_id
                )
            )
            if type_ != "m.room.member" or not self.hs.is_mine_id(state_key):
                continue
            if event_id is None or membership is None:
                txn.execute(
                    "DELETE FROM local_current_membership WHERE room_id = ? AND user_id = ?",
                    (room_id, state_key),
                )
            else:
                txn.execute(
                    "INSERT INTO local_current_membership (room_id, user_id, event_id,"
                    " membership, event_stream_ordering) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (user_id, room_id) DO UPDATE SET event_id = EXCLUDED.event_id,"
                    " membership = EXCLUDED.membership,"
                    " event_stream_ordering = EXCLUDED.event_stream_ordering",
                    (room_id, state_key, event_id, membership, ordering),
                )
        return changed

    def _insert_push_actions_txn(
        self, txn: LoggingTransaction, events: list[Event], push_actions: Mapping[str, Any]
    ) -> None:
        """The per-user push actions (``push_actions``: event_id ->
        ``handlers.push.EventPushActions``; the defaults are on the events' rows)."""
        exceptions = []
        now = self.clock.time_msec()
        for event in events:
            actions = push_actions.get(event.event_id)
            if actions is None:
                continue
            for user_id, (user_actions, notif, highlight) in actions.exceptions.items():
                exceptions.append(
                    (
                        event.room_id,
                        event.event_id,
                        user_id,
                        event.stream_ordering,
                        json_encoder(user_actions),
                        notif,
                        highlight,
                        now,
                    )
                )
        if exceptions:
            txn.execute_later(
                "INSERT INTO event_push_actions (room_id, event_id, user_id, stream_ordering,"
                " actions, notif, highlight, received_ts) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                exceptions,
            )

    def _update_room_row_txn(self, txn: LoggingTransaction, event: Event) -> None:
        if event.type == "m.room.create" and event.state_key == "":
            txn.execute(
                "INSERT INTO rooms (room_id, creator, is_public, room_version, creation_ts,"
                " event_writer) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (room_id) DO NOTHING",
                (
                    event.room_id,
                    event.sender,
                    False,
                    str(event.content.get("room_version", IMPLICIT_ROOM_VERSION.identifier)),
                    event.origin_server_ts,
                    # The writer persisting the create event owns the room.
                    self._instance_name,
                ),
            )
        if event.type == "m.room.join_rules" and event.state_key == "":
            txn.execute(
                "UPDATE rooms SET is_public = ? WHERE room_id = ?",
                (event.content.get("join_rule") == "public", event.room_id),
            )

    def _update_current_state_txn(
        self, txn: LoggingTransaction, event: Event, current: bool = True
    ) -> None:
        """The event's membership rows, and (``current``) the current state
        and its delta stream as the event changes them."""
        assert event.state_key is not None
        # The writes are held for the transaction's next statement (one round
        # trip on PostgreSQL); only the previous state event is read.
        if not current:
            if event.membership is not None and event.type == "m.room.member":
                txn.execute_later(
                    "INSERT INTO room_memberships (event_id, user_id, sender, room_id,"
                    " membership, stream_ordering) VALUES (?, ?, ?, ?, ?, ?)",
                    [(event.event_id, event.state_key, event.sender, event.room_id,
                      event.membership, event.stream_ordering)],
                )  # fmt: skip
            return
        txn.execute(
            "SELECT event_id FROM current_state_events"
            " WHERE room_id = ? AND type = ? AND state_key = ?",
            (event.room_id, event.type, event.state_key),
        )
        row = txn.fetchone()
        prev_event_id = row[0] if row else None
        txn.execute_later(
            "INSERT INTO current_state_events (room_id, type, state_key, event_id, membership)"
            " VALUES (?, ?, ?, ?, ?) ON CONFLICT (room_id, type, state_key) DO UPDATE"
            " SET event_id = EXCLUDED.event_id, membership = EXCLUDED.membership",
            [(event.room_id, event.type, event.state_key, event.event_id, event.membership)],
        )
        txn.execute_later(
            "INSERT INTO current_state_delta_stream (stream_id, instance_name, room_id, type,"
            " state_key, event_id, prev_event_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    event.stream_ordering,
                    event.instance_name,
                    event.room_id,
                    event.type,
                    event.state_key,
                    event.event_id,
                    prev_event_id,
                )
            ],
        )
        membership = event.membership
        if membership is None or event.type != "m.room.member":
            return
        txn.execute_later(
            "INSERT INTO room_memberships (event_id, user_id, sender, room_id, membership,"
            " stream_ordering) VALUES (?, ?, ?, ?, ?, ?)",
            [
                (
                    event.event_id,
                    event.state_key,
                    event.sender,
                    event.room_id,
                    membership,
                    event.stream_ordering,
                )
            ],
        )
        if self.hs.is_mine_id(event.state_key):
            txn.execute_later(
                "INSERT INTO local_current_membership (room_id, user_id, event_id, membership,"
                " event_stream_ordering) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (user_id, room_id) DO UPDATE SET event_id = EXCLUDED.event_id,"
                " membership = EXCLUDED.membership,"
                " event_stream_ordering = EXCLUDED.event_stream_ordering",
                [
                    (
                        event.room_id,
                        event.state_key,
                        event.event_id,
                        membership,
                        event.stream_ordering,
                    )
                ],
            )


def _state_with(
    txn: LoggingTransaction, group: GroupRef | None, key: StateKey, event_id: str
) -> dict[StateKey, str]:
    """The state of ``group`` (empty for None) with ``key`` set to ``event_id``."""
    state = state_of_group_txn(txn, group.id) if group else {}
    state[key] = event_id
    return state
