"""Reading events, and the events and backfill streams as every process sees them."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from synapse_lite.api.identifiers import server_of
from synapse_lite.api.room_versions import (
    IMPLICIT_ROOM_VERSION,
    SPEC_ROOM_VERSIONS,
    RoomVersion,
)
from synapse_lite.event_graph.authorisation import redaction_applies
from synapse_lite.event_graph.pdu import Pdu, StateKey, stored_as_pdu
from synapse_lite.events import Event, pruned_content
from synapse_lite.storage._base import db_to_json, json_encoder, page_of_updates
from synapse_lite.storage.caches import LruCache, cached
from synapse_lite.storage.change_tracker import RecentRoomEvents, StreamChangeTracker
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.storage.databases.main.cache import CacheInvalidationWorkerStore
from synapse_lite.storage.databases.main.relations import ChildlessEvents
from synapse_lite.streams.catalog import (
    BACKFILL,
    BackfillStreamRow,
    EventsStreamCurrentStateRow,
    EventsStreamEventRow,
)
from synapse_lite.tokens import RoomStreamToken

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext

logger = logging.getLogger(__name__)

assert BACKFILL.ids is not None
_BACKFILL_IDS = BACKFILL.ids

EVENT_COLUMNS = (
    "event_id, room_id, type, state_key, sender, content, origin_server_ts,"
    " stream_ordering, topological_ordering, instance_name, redacts, outlier,"
    " rejected, soft_failed"
)

#: The condition on ``events`` (alias ``e`` or none) of what clients may be
#: given: not rejected, soft-failed nor an outlier (docs/event-graph.md,
#: "Rejected, soft-failed and outliers"). Columns of the row itself: no
#: join, no extra query.
SERVED = "NOT outlier AND NOT rejected AND NOT soft_failed"
SERVED_E = "NOT e.outlier AND NOT e.rejected AND NOT e.soft_failed"


def event_from_row(row: tuple[Any, ...]) -> Event:
    """Build an :class:`Event` from a row selected with :data:`EVENT_COLUMNS`."""
    return Event(
        event_id=row[0],
        room_id=row[1],
        type=row[2],
        state_key=row[3],
        sender=row[4],
        content=db_to_json(row[5]),
        origin_server_ts=int(row[6]),
        stream_ordering=int(row[7]),
        depth=int(row[8]),
        instance_name=row[9],
        redacts=row[10],
        outlier=bool(row[11]),
        rejected=bool(row[12]),
        soft_failed=bool(row[13]),
    )


#: A transaction id is scoped to its endpoint (client-server API,
#: "Transaction identifiers"): ``PUT /send/.../t1`` and ``PUT /redact/.../t1``
#: are two requests. Both keep their ids in ``event_txn_ids``; a redaction's
#: is stored behind this prefix (a control character no client puts in an id
#: it means as text), so it never meets a /send's id of the same text.
REDACTION_TXN_PREFIX = "\x1fredact\x1f"


def redaction_txn_id(txn_id: str) -> str:
    """How a redaction's transaction id is stored in ``event_txn_ids``."""
    return REDACTION_TXN_PREFIX + txn_id


def client_txn_id(stored: str) -> str:
    """The transaction id the client sent, from its stored form."""
    return stored.removeprefix(REDACTION_TXN_PREFIX)


#: Events whose client transaction keys a writer remembers (about a
#: minute of sends at a high rate: what a woken /sync reads back).
RECENT_TXN_KEYS = 10_000


#: MSC2228's content key: when (ms since the epoch) the event's content goes.
SELF_DESTRUCT_AFTER = "org.matrix.self_destruct_after"
#: The name other processes' event caches are invalidated by (caches stream).
EVENT_CACHE = "get_event"


def self_destruct_after(content: dict[str, Any]) -> int | None:
    """The expiry an event's content asks for (MSC2228), if it is an integer
    time; anything else asks for nothing."""
    value = content.get(SELF_DESTRUCT_AFTER)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


#: Events a process remembers as having no redaction, and events it
#: remembers were dropped from its cache.
UNREDACTED_EVENTS = 10_000


class UnredactedEvents:
    """Events this server made, known to have no redaction: the redactions
    read of a /sync serving them skips them.

    Sound because nobody can redact an event before its id exists, and a
    process learns of every redaction after that (its writer's own after
    commit, another's from the events or backfill stream) through
    :meth:`EventsWorkerStore.invalidate_event_cache`, which calls
    :meth:`forget`. Remembered: on the process that made them, events it
    persisted while no event was dropped from its cache (a redaction of them
    may be among those); elsewhere, events whose events-stream row says this
    server made them (``local``), after the rest of their batch. An event
    once forgotten is not remembered again (a redaction may arrive before its
    target when a room changes writers) while it is among the last
    :data:`UNREDACTED_EVENTS` forgotten. Events of other servers are never
    remembered: their redactions may come first.

    :meth:`unknown` may run on a database thread while the reactor thread
    adds and forgets: it only tests membership of a plain dict, which the
    interpreter keeps consistent; the oldest entry goes first."""

    def __init__(self, max_entries: int = UNREDACTED_EVENTS) -> None:
        self._max_entries = max_entries
        self._known: dict[str, None] = {}
        self._forgotten: dict[str, None] = {}

    def unknown(self, event_ids: Iterable[str]) -> list[str]:
        """Those of ``event_ids`` not known to be unredacted."""
        known = self._known
        return [e for e in event_ids if e not in known]

    def remember(self, event_ids: Iterable[str]) -> None:
        known, forgotten = self._known, self._forgotten
        for event_id in event_ids:
            if event_id not in forgotten:
                known[event_id] = None
        self._trim(known)

    def forget(self, event_id: str) -> None:
        self._known.pop(event_id, None)
        self._forgotten[event_id] = None
        self._trim(self._forgotten)

    def forget_all(self) -> None:
        self._known.clear()

    def forgotten(self, event_id: str) -> bool:
        """Whether the event was dropped from the cache lately (a redaction
        of it among the causes), while among the last forgotten."""
        return event_id in self._forgotten

    def _trim(self, entries: dict[str, None]) -> None:
        while len(entries) > self._max_entries:
            del entries[next(iter(entries))]


class EventsWorkerStore(CacheInvalidationWorkerStore):
    """Events by id, the events stream's positions and its update function."""

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ):
        super().__init__(database, db_conn, hs)
        self._stream_id_gen = hs.id_generators.of("events")
        self._event_cache: LruCache[Event] = LruCache(hs.config.caches.event_cache_entries)
        #: Counts what dropped events from the cache: a read that one
        #: overtook caches nothing (``_served_events``).
        self._event_cache_drops = 0
        #: The client transaction key (user, device, stored txn id) of each
        #: event this process persisted lately, None for one sent without:
        #: a /sync here then serves its ``transaction_id`` without a read.
        #: Exact, since ``event_txn_ids`` rows are written with the event
        #: and never change.
        self._txn_keys_by_event: LruCache[tuple[str, str, str] | None] = LruCache(RECENT_TXN_KEYS)
        self._self_destructing = hs.config.experimental.msc2228_self_destructing_events
        #: Rooms with new events, and users with new memberships, by position.
        self.room_changes = StreamChangeTracker(self.get_room_max_token)
        self.membership_changes = StreamChangeTracker(self.get_room_max_token)
        #: Rooms with new membership events, by position (a woken /sync's
        #: device_lists section asks of every joined room).
        self.room_membership_changes = StreamChangeTracker(self.get_room_max_token)
        self.childless_events = ChildlessEvents()
        self._unredacted_events = UnredactedEvents()
        #: Each room's newest served events, by position: what an
        #: incremental /sync's timeline reads first (``get_room_events_between``).
        self.recent_room_events = RecentRoomEvents(self.get_room_max_token)

    def record_event_position(
        self,
        room_id: str,
        event_type: str,
        state_key: str | None,
        instance_name: str,
        stream_id: int,
    ) -> None:
        """Note where a room (and a member's membership) last changed."""
        self.room_changes.record(room_id, instance_name, stream_id)
        if event_type == "m.room.member" and state_key is not None:
            self.record_membership_position(room_id, state_key, instance_name, stream_id)

    def record_membership_position(
        self, room_id: str, user_id: str, instance_name: str, stream_id: int
    ) -> None:
        """Note where a member's membership last changed: with their member
        event, and with a current state row that resolution changed (the
        member's current membership moved with no new event of theirs, which
        the unread counts and the joined rooms of a /sync must see)."""
        self.membership_changes.record(user_id, instance_name, stream_id)
        self.room_membership_changes.record(room_id, instance_name, stream_id)

    # Positions

    def get_room_max_token(self) -> RoomStreamToken:
        """The newest position a reader may use: each writer's position as far
        as this process has processed its rows (so caches and change trackers
        are current up to it), with the smallest as the base.

        Not the persisted-up-to position: other writers' announcements can
        lift that past rows of a writer this process has not processed yet.
        """
        id_gen = self._stream_id_gen
        positions = id_gen.known_writer_positions()
        me = self._instance_name
        if me in positions:
            positions[me] = id_gen.writer_position(me)
        if not positions:
            return RoomStreamToken(id_gen.persisted_upto_position())
        return RoomStreamToken.from_positions(min(positions.values()), positions)

    def get_room_max_stream_ordering(self) -> int:
        return self._stream_id_gen.persisted_upto_position()

    # Events by id

    async def get_event(self, event_id: str) -> Event | None:
        return (await self.get_events([event_id])).get(event_id)

    async def get_events(self, event_ids: Iterable[str]) -> dict[str, Event]:
        """The events found among ``event_ids`` (missing ones are left out)."""
        result: dict[str, Event] = {}
        missing: list[str] = []
        for event_id in event_ids:
            found, event = self._event_cache.get(event_id)
            if found and event is not None:
                result[event_id] = event
            else:
                missing.append(event_id)
        if missing:

            def read(txn: LoggingTransaction) -> tuple[list[Event], dict[str, list[str]]]:
                fetched = self._get_events_txn(txn, missing)
                return fetched, self._redactions_of_txn(txn, [e.event_id for e in fetched])

            drops = self._event_cache_drops
            # The rows and their redactions in one interaction (one thread
            # hop, one snapshot).
            fetched, by_target = await self.db_pool.runInteraction(
                "get_events", read, read_only=True
            )
            for event in await self._served_events(fetched, by_target, drops):
                result[event.event_id] = event
        return result

    async def _served_events(
        self, events: list[Event], by_target: dict[str, list[str]], drops: int
    ) -> list[Event]:
        """``events`` as read with their redactions (``by_target``), the
        redactions applied, and cached as served (a timeline's events are
        then not read again by id for their bundles). A redaction arriving
        later drops the redacted event from every process's cache (its
        events-stream row names what it redacts); ``drops``: the cache's
        drop count when the read started: if anything was dropped since, the
        read may predate it, and nothing is cached."""
        served = await self._apply_redactions(events, by_target)
        if drops == self._event_cache_drops:
            for event in served:
                self._event_cache.set(event.event_id, event)
        return served

    def _get_events_txn(self, txn: LoggingTransaction, event_ids: list[str]) -> list[Event]:
        events: list[Event] = []
        for start in range(0, len(event_ids), 500):
            chunk = event_ids[start : start + 500]
            placeholders = ", ".join("?" for _ in chunk)
            txn.execute(
                f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id IN ({placeholders})", chunk
            )
            events.extend(event_from_row(row) for row in txn.fetchall())
        return events

    async def get_events_as_stored(self, event_ids: Sequence[str]) -> dict[str, Event]:
        """The events found among ``event_ids`` as they were persisted, a
        redaction not applied (for their content hashes; never cached)."""
        events = await self.db_pool.runInteraction(
            "get_events_as_stored", self._get_events_txn, list(event_ids), read_only=True
        )
        return {e.event_id: e for e in events}

    async def get_event_edges(
        self, event_ids: Sequence[str]
    ) -> dict[str, tuple[list[str], list[str]]]:
        """The ``prev_events`` and ``auth_events`` of each of ``event_ids``
        (sorted; both empty for an event with none, such as a create event)."""

        def txn(txn: LoggingTransaction) -> dict[str, tuple[list[str], list[str]]]:
            found: dict[str, tuple[list[str], list[str]]] = {e: ([], []) for e in event_ids}
            for start in range(0, len(event_ids), 500):
                chunk = list(event_ids[start : start + 500])
                marks = ", ".join("?" for _ in chunk)
                for table, column, side in (
                    ("event_edges", "prev_event_id", 0),
                    ("event_auth_edges", "auth_id", 1),
                ):
                    txn.execute(
                        f"SELECT event_id, {column} FROM {table} WHERE event_id IN ({marks})",
                        chunk,
                    )
                    for event_id, other in txn.fetchall():
                        found[event_id][side].append(other)
            for prevs, auths in found.values():
                prevs.sort()
                auths.sort()
            return found

        return await self.db_pool.runInteraction("get_event_edges", txn, read_only=True)

    async def with_redactions(self, events: list[Event]) -> list[Event]:
        """``events``, each redacted one pruned with ``redacted_because`` set
        (the earliest redaction of it wins)."""
        if not events:
            return events
        by_target = await self.db_pool.runInteraction(
            "get_redactions",
            self._redactions_of_txn,
            [e.event_id for e in events],
            read_only=True,
        )
        return await self._apply_redactions(events, by_target)

    def _redactions_of_txn(self, txn: LoggingTransaction, ids: list[str]) -> dict[str, list[str]]:
        """The redactions of each of ``ids`` that has some, earliest first,
        by the redacted event's id (for :meth:`_apply_redactions`; a read
        that fetched the events runs it in the same transaction)."""
        by_target: dict[str, list[str]] = {}
        ids = self._unredacted_events.unknown(ids)
        for start in range(0, len(ids), 500):
            chunk = ids[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            txn.execute(
                "SELECT redacts, event_id FROM events WHERE type = 'm.room.redaction'"
                f" AND redacts IN ({marks}) AND NOT rejected AND NOT soft_failed"
                " ORDER BY stream_ordering",
                chunk,
            )
            for target, redaction in txn.fetchall():
                by_target.setdefault(target, []).append(redaction)
        return by_target

    async def _apply_redactions(
        self, events: list[Event], by_target: dict[str, list[str]]
    ) -> list[Event]:
        """``events`` with the redactions :meth:`_redactions_of_txn` found
        applied: the earliest that applies to each (``redaction_applies``:
        a redaction of another room's event, of itself, or in versions 3 on
        of another server's event by a user without the power to redact, is
        ignored)."""
        if not by_target:
            return events
        # Read as stored, not through get_events: two redactions of each
        # other would otherwise read each other without end.
        redactions = await self.get_events_as_stored(
            sorted({r for rs in by_target.values() for r in rs})
        )
        result = []
        for event in events:
            applied = None
            for redaction_id in by_target.get(event.event_id, ()):
                redaction = redactions.get(redaction_id)
                if redaction is not None and await self._redaction_applies(redaction, event):
                    applied = redaction
                    break
            if applied is None:
                result.append(event)
            else:
                version = await self.get_room_version(event.room_id)
                result.append(event.redacted(applied, version))
        return result

    async def _redaction_applies(self, redaction: Event, target: Event) -> bool:
        version = await self.get_room_version(target.room_id)
        state: dict[StateKey, Pdu] = {}
        if (
            redaction.room_id == target.room_id
            and not version.redaction_auth_rule
            and server_of(redaction.sender) != server_of(target.sender)
        ):
            # The power to redact, as the room's state says now.
            rows = await self.db_pool.select(
                "redaction_power_state",
                "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?"
                " AND type IN ('m.room.create', 'm.room.power_levels') AND state_key = ''",
                target.room_id,
            )
            found = await self.get_events([str(r[2]) for r in rows])
            state = {
                (str(r[0]), str(r[1])): stored_as_pdu(found[r[2]]) for r in rows if r[2] in found
            }
        return redaction_applies(version, stored_as_pdu(redaction), stored_as_pdu(target), state)

    async def get_room_version(self, room_id: str) -> RoomVersion:
        """The version of a room this server has (its create event's: any
        of the spec's 1-12, a room of another server we joined may be of
        version 12, which we do not create yet; a version we do not know,
        which no room here has, reads as version 1, the spec's default,
        whose redaction algorithm keeps the least)."""
        identifier = await self._get_room_version_id(room_id)
        if identifier is None:
            # Not cached as missing: the room may be created in a moment.
            self._get_room_version_id.invalidate(room_id)
            return IMPLICIT_ROOM_VERSION
        return SPEC_ROOM_VERSIONS.get(identifier, IMPLICIT_ROOM_VERSION)

    @cached(max_entries=100_000)
    async def _get_room_version_id(self, room_id: str) -> str | None:
        # A room's version never changes: nothing invalidates this.
        rows = await self.db_pool.select(
            "get_room_version", "SELECT room_version FROM rooms WHERE room_id = ?", room_id
        )
        return str(rows[0][0]) if rows else None

    async def get_forward_extremities(self, room_id: str) -> dict[str, int]:
        """The room's forward extremities (its events with no children yet),
        each with its depth."""
        rows = await self.db_pool.select(
            "get_forward_extremities",
            "SELECT x.event_id, e.topological_ordering FROM event_forward_extremities AS x"
            " JOIN events AS e ON e.event_id = x.event_id WHERE x.room_id = ?",
            room_id,
        )
        return {str(event_id): int(depth) for event_id, depth in rows}

    async def get_missing_prev_events(self, event_ids: Sequence[str], limit: int) -> list[str]:
        """The ``prev_events`` of ``event_ids`` that are not in the room's
        history: not stored, or stored only as outliers (the parent a gap
        was filled at, say): holes in the history a reader reads, at most
        ``limit``, sorted."""
        if not event_ids:
            return []
        marks = ", ".join("?" for _ in event_ids)
        rows = await self.db_pool.select(
            "get_missing_prev_events",
            "SELECT DISTINCT x.prev_event_id FROM event_edges AS x"
            " LEFT JOIN events AS p ON p.event_id = x.prev_event_id"
            f" WHERE x.event_id IN ({marks}) AND (p.event_id IS NULL OR p.outlier)"
            " ORDER BY x.prev_event_id LIMIT ?",
            *event_ids,
            limit,
        )
        return [str(r[0]) for r in rows]

    async def get_backward_extremities(self, room_id: str, limit: int) -> list[str]:
        """Where the room's known history has holes to backfill
        (docs/federation.md, "Backfill"): ``prev_events`` of the room's
        stored, not rejected events (outliers too) that are not stored at
        all, at most ``limit``, those of the deepest children first. Reads
        the room's edges: asked only when a reader reached the start of
        what we hold."""
        rows = await self.db_pool.select(
            "get_backward_extremities",
            "SELECT x.prev_event_id, MAX(e.topological_ordering) AS child_depth"
            " FROM events AS e JOIN event_edges AS x ON x.event_id = e.event_id"
            " LEFT JOIN events AS p ON p.event_id = x.prev_event_id"
            " WHERE e.room_id = ? AND NOT e.rejected AND p.event_id IS NULL"
            " GROUP BY x.prev_event_id ORDER BY child_depth DESC, x.prev_event_id LIMIT ?",
            room_id,
            limit,
        )
        return [str(r[0]) for r in rows]

    async def get_event_id_for_txn(self, user_id: str, device_id: str, txn_id: str) -> str | None:
        """The event an earlier send with this transaction id created, if any."""
        rows = await self.db_pool.select(
            "get_event_id_for_txn",
            "SELECT event_id FROM event_txn_ids WHERE user_id = ? AND device_id = ? AND txn_id = ?",
            user_id,
            device_id,
            txn_id,
        )
        return rows[0][0] if rows else None

    async def get_txn_ids_for_events(
        self, user_id: str, device_id: str, event_ids: list[str]
    ) -> dict[str, str]:
        """The transaction ids ``device_id`` of ``user_id`` sent any of
        ``event_ids`` with, by event id (events it did not send are absent).
        The primary key's (user_id, device_id) prefix bounds the scan."""
        found: dict[str, str] = {}
        unknown = []
        for event_id in event_ids:
            known, key = self._txn_keys_by_event.get(event_id)
            if not known:
                unknown.append(event_id)
            elif key is not None and key[:2] == (user_id, device_id):
                found[event_id] = client_txn_id(key[2])
        for start in range(0, len(unknown), 500):
            chunk = unknown[start : start + 500]
            placeholders = ", ".join("?" for _ in chunk)
            rows = await self.db_pool.select(
                "get_txn_ids_for_events",
                "SELECT event_id, txn_id FROM event_txn_ids WHERE user_id = ? AND device_id = ?"
                f" AND event_id IN ({placeholders})",
                user_id,
                device_id,
                *chunk,
            )
            found.update((event_id, client_txn_id(txn_id)) for event_id, txn_id in rows)
        return found

    def invalidate_event_cache(self, event_id: str) -> None:
        self._event_cache_drops += 1
        self._event_cache.pop(event_id)
        self._unredacted_events.forget(event_id)

    def event_cache_drops(self) -> int:
        """How many times events were dropped from the cache so far (for
        :meth:`remember_made_unredacted`)."""
        return self._event_cache_drops

    def remember_made_unredacted(self, events: Iterable[Event], drops: int) -> None:
        """``events`` were made on this server and persisted, with no event
        dropped from the cache since ``drops`` (:meth:`event_cache_drops`
        before persisting them) unless it is changed now: none of them has a
        redaction, and a /sync serving them reads none (:class:`UnredactedEvents`)."""
        if drops == self._event_cache_drops:
            self._unredacted_events.remember(e.event_id for e in events)

    def invalidate_cache_by_name(self, name: str, keys: list[Any] | None) -> None:
        # The event cache is no cached method: other processes name it so.
        if name == EVENT_CACHE:
            if keys is None:
                self._event_cache_drops += 1
                self._event_cache.clear()
                self._unredacted_events.forget_all()
            else:
                self.invalidate_event_cache(keys[0])
            return
        super().invalidate_cache_by_name(name, keys)

    # Self-destructing events (MSC2228)

    async def get_events_due_to_expire(self, now_ms: int, limit: int) -> list[str]:
        """Events whose content is due to be pruned by ``now_ms``, oldest first."""
        rows = await self.db_pool.select(
            "get_events_due_to_expire",
            "SELECT event_id FROM event_expiry WHERE expiry_ts <= ? ORDER BY expiry_ts LIMIT ?",
            now_ms,
            limit,
        )
        return [r[0] for r in rows]

    async def expire_event(self, event_id: str) -> None:
        """Prune an event's stored content as a redaction prunes it and forget
        its expiry, here and (caches stream) in every process's event cache.
        Not a write to the events stream: the event keeps its position, and
        any one process may do it."""

        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute(
                "SELECT e.type, e.content, r.room_version FROM events AS e"
                " LEFT JOIN rooms AS r USING (room_id) WHERE e.event_id = ?",
                (event_id,),
            )
            row = txn.fetchone()
            if row is not None:
                version = SPEC_ROOM_VERSIONS.get(str(row[2]), IMPLICIT_ROOM_VERSION)
                pruned = pruned_content(row[0], db_to_json(row[1]), version)
                txn.execute(
                    "UPDATE events SET content = ? WHERE event_id = ?",
                    (json_encoder(pruned), event_id),
                )
            txn.execute("DELETE FROM event_expiry WHERE event_id = ?", (event_id,))
            self.send_invalidation_txn(txn, EVENT_CACHE, [event_id])
            txn.call_after(self.invalidate_event_cache, event_id)

        await self.db_pool.runInteraction("expire_event", txn_func)

    # The events stream's update functions

    async def get_events_stream_updates(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[int, Any]], int, bool]:
        """The events stream's update function: the events ``instance_name``
        wrote in ``(last_id, current_id]`` and the current-state changes they
        made, oldest first, read in one transaction. For one id the event's
        row comes before its state rows."""

        def txn_func(
            txn: LoggingTransaction,
        ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
            args = (last_id, current_id, instance_name, limit)
            txn.execute(
                "SELECT stream_ordering, event_id, room_id, type, state_key, redacts,"
                " membership, outlier, (SELECT er.relates_to_id FROM event_relations AS er"
                "  WHERE er.event_id = events.event_id), rejected, sender FROM events"
                " WHERE ? < stream_ordering AND stream_ordering <= ? AND instance_name = ?"
                " ORDER BY stream_ordering ASC LIMIT ?",
                args,
            )
            events = [tuple(r) for r in txn.fetchall()]
            txn.execute(
                "SELECT stream_id, room_id, type, state_key, event_id"
                " FROM current_state_delta_stream"
                " WHERE ? < stream_id AND stream_id <= ? AND instance_name = ?"
                " ORDER BY stream_id ASC LIMIT ?",
                args,
            )
            return events, [tuple(r) for r in txn.fetchall()]

        event_rows, state_rows = await self.db_pool.runInteraction(
            "get_events_stream_updates", txn_func, read_only=True
        )
        upto, limited = current_id, False
        # Each state row has the id of the one event that made it, so no id is
        # split between pages; stop where the first truncated source stops so
        # nothing of a later id goes out before an earlier one.
        if len(event_rows) >= limit:
            upto, limited = event_rows[-1][0], True
        if len(state_rows) >= limit:
            upto, limited = min(upto, state_rows[-1][0]), True
        updates: list[tuple[int, Any]] = [
            (
                int(r[0]),
                EventsStreamEventRow(
                    event_id=r[1],
                    room_id=r[2],
                    type=r[3],
                    state_key=r[4],
                    redacts=r[5],
                    relates_to=r[8],
                    membership=r[6],
                    rejected=bool(r[9]),
                    outlier=bool(r[7]),
                    local=server_of(r[10]) == self.server_name,
                ),
            )
            for r in event_rows
            if r[0] <= upto
        ]
        updates.extend(
            (
                int(r[0]),
                EventsStreamCurrentStateRow(room_id=r[1], type=r[2], state_key=r[3], event_id=r[4]),
            )
            for r in state_rows
            if r[0] <= upto
        )
        # Stable: for one id the event row stays before its state rows.
        updates.sort(key=lambda u: u[0])
        return updates, upto, limited

    async def get_backfill_stream_updates(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[int, BackfillStreamRow]], int, bool]:
        """The backfill stream's update function (in positions, like every
        update function; the events' stream orderings are the stored ids)."""
        ids = _BACKFILL_IDS

        def txn_func(txn: LoggingTransaction) -> list[tuple[Any, ...]]:
            txn.execute(
                f"SELECT {ids.position_sql('stream_ordering')},"
                " event_id, room_id, type, state_key, redacts FROM events"
                f" WHERE {ids.position_condition('stream_ordering', '>')}"
                f" AND {ids.position_condition('stream_ordering', '<=')} AND instance_name = ?"
                f" ORDER BY {ids.position_order_sql('stream_ordering')} LIMIT ?",
                (ids.stored_id(last_id), ids.stored_id(current_id), instance_name, limit),
            )
            return [tuple(r) for r in txn.fetchall()]

        rows = await self.db_pool.runInteraction(
            "get_backfill_stream_updates", txn_func, read_only=True
        )
        updates = [
            (
                int(r[0]),
                BackfillStreamRow(
                    event_id=r[1],
                    room_id=r[2],
                    type=r[3],
                    state_key=r[4],
                    redacts=r[5],
                    relates_to=None,
                ),
            )
            for r in rows
        ]
        return page_of_updates(updates, limit, current_id)

    # What new events make stale

    def invalidate_caches_for_event(self, event_id: str, redacts: str | None) -> None:
        """Forget what one new event makes stale beyond its room's state."""
        if redacts:
            self.invalidate_event_cache(redacts)

    def invalidate_for_events_rows(self, writer: str, token: int, rows: Sequence[Any]) -> None:
        """Rows of the events stream another process wrote (one batch, one
        id): forget what they make stale, each room's state caches once, and
        note where rooms and memberships changed."""
        state_changed: dict[str, set[str]] = {}
        fresh: list[str] = []
        made_here: list[str] = []
        for row in rows:
            if isinstance(row, EventsStreamEventRow):
                self.invalidate_caches_for_event(row.event_id, row.redacts)
                if row.relates_to is not None:
                    self.childless_events.related_to([row.relates_to])
                if not (row.outlier or row.rejected):
                    fresh.append(row.event_id)
                    if row.local:
                        made_here.append(row.event_id)
                # A batch's rows carry its last id, not each its own (and a
                # row does not say whether another server's event was
                # soft-failed): held only where persisted, the room is read
                # from the database below this.
                self.recent_room_events.unknown(row.room_id, token)
                self.record_event_position(row.room_id, row.type, row.state_key, writer, token)
                if row.state_key is not None:
                    members = state_changed.setdefault(row.room_id, set())
                    if row.type == "m.room.member":
                        members.add(row.state_key)
            else:
                state_changed.setdefault(row.room_id, set())
                if row.type == "m.room.member":
                    self.record_membership_position(row.room_id, row.state_key, writer, token)
        # After the batch's relations: one relating to an event of the same
        # batch keeps it unknown.
        self.childless_events.fresh(fresh)
        # After the batch's redactions too: a redaction arriving before its
        # target (a room changing writers) keeps it unknown.
        self._unredacted_events.remember(made_here)
        for room_id, members in state_changed.items():
            self.invalidate_state_caches(room_id, members)

    def invalidate_for_backfill_rows(self, rows: Sequence[BackfillStreamRow]) -> None:
        if rows:
            # Backfill rows do not say what their events relate to.
            self.childless_events.forget_all()
        for row in rows:
            self.invalidate_caches_for_event(row.event_id, row.redacts)
