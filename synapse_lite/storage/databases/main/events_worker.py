"""Reading events, and the events and backfill streams as every process sees them."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from synapse_lite.events import Event
from synapse_lite.storage._base import db_to_json
from synapse_lite.storage.caches import LruCache
from synapse_lite.storage.change_tracker import StreamChangeTracker
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.storage.databases.main.cache import CacheInvalidationWorkerStore
from synapse_lite.storage.stream_ids import BACKFILL, EVENTS
from synapse_lite.tokens import RoomStreamToken

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

logger = logging.getLogger(__name__)

EVENT_COLUMNS = (
    "event_id, room_id, type, state_key, sender, content, origin_server_ts,"
    " stream_ordering, topological_ordering, instance_name, redacts, outlier"
)


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
    )


class EventsWorkerStore(CacheInvalidationWorkerStore):
    """Events by id, the events stream's positions and its update function."""

    def __init__(self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: HomeServer):
        super().__init__(database, db_conn, hs)
        self._stream_id_gen = self.build_id_generator(db_conn, EVENTS)
        self._backfill_id_gen = self.build_id_generator(db_conn, BACKFILL)
        self._event_cache: LruCache[Event] = LruCache(hs.config.caches.event_cache_entries)
        #: Rooms with new events, and users with new memberships, by position.
        self.room_changes = StreamChangeTracker(self.get_room_max_token)
        self.membership_changes = StreamChangeTracker(self.get_room_max_token)

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
            self.membership_changes.record(state_key, instance_name, stream_id)

    # Positions

    def get_room_max_token(self) -> RoomStreamToken:
        """The newest position a reader may use: each writer's position as far
        as this process has processed its rows (so caches and change trackers
        are current up to it), with the smallest as the base.

        Not the persisted-up-to position: other writers' announcements can
        lift that past rows of a writer this process has not processed yet.
        """
        id_gen = self._stream_id_gen
        positions = id_gen.get_positions()
        me = self._instance_name
        if me in positions:
            positions[me] = id_gen.get_current_token_for_writer(me)
        if not positions:
            return RoomStreamToken(id_gen.get_current_token())
        return RoomStreamToken.from_positions(min(positions.values()), positions)

    def get_room_max_stream_ordering(self) -> int:
        return self._stream_id_gen.get_current_token()

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
            fetched = await self.db_pool.runInteraction(
                "get_events", self._get_events_txn, missing, read_only=True
            )
            for event in fetched:
                self._event_cache.set(event.event_id, event)
                result[event.event_id] = event
        return result

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

    def invalidate_event_cache(self, event_id: str) -> None:
        self._event_cache.pop(event_id)

    # The events stream's update functions

    async def get_events_stream_rows(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """What ``instance_name`` wrote to the events stream in ``(last_id,
        current_id]``, oldest first, at most ``limit`` of each kind, read in one
        transaction:

        * events: ``(stream_ordering, event_id, room_id, type, state_key,
          redacts, membership, outlier)``;
        * current-state changes: ``(stream_id, room_id, type, state_key, event_id)``.
        """

        def txn_func(
            txn: LoggingTransaction,
        ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
            args = (last_id, current_id, instance_name, limit)
            txn.execute(
                "SELECT stream_ordering, event_id, room_id, type, state_key, redacts,"
                " membership, outlier FROM events"
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

        return await self.db_pool.runInteraction("get_events_stream_rows", txn_func, read_only=True)

    async def get_all_new_backfill_event_rows(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> list[tuple[Any, ...]]:
        """Backfilled events in ``(last_id, current_id]`` of the (positive on the
        wire) backfill stream: ``(token, event_id, room_id, type, state_key,
        redacts)``."""

        def txn_func(txn: LoggingTransaction) -> list[tuple[Any, ...]]:
            txn.execute(
                "SELECT -stream_ordering, event_id, room_id, type, state_key, redacts FROM events"
                " WHERE ? < -stream_ordering AND -stream_ordering <= ? AND instance_name = ?"
                " ORDER BY stream_ordering DESC LIMIT ?",
                (last_id, current_id, instance_name, limit),
            )
            return [tuple(r) for r in txn.fetchall()]

        return await self.db_pool.runInteraction(
            "get_all_new_backfill_event_rows", txn_func, read_only=True
        )

    # Replication

    def invalidate_caches_for_event(
        self,
        event_id: str,
        room_id: str,
        event_type: str,
        state_key: str | None,
        redacts: str | None,
    ) -> None:
        """Forget what a new event makes stale (here, and on receivers of its row)."""
        if redacts:
            self.invalidate_event_cache(redacts)
        if state_key is not None:
            self.invalidate_cache_by_name("get_current_state_ids", [room_id])
            self.invalidate_cache_by_name("get_room_summary", [room_id])
        if event_type == "m.room.member" and state_key is not None:
            self.invalidate_cache_by_name("get_rooms_for_user", [state_key])
            self.invalidate_cache_by_name("get_local_memberships_with_positions", [state_key])
            self.invalidate_cache_by_name("get_users_in_room", [room_id])

    def process_replication_rows(
        self, stream_name: str, instance_name: str, token: int, rows: Iterable[Any]
    ) -> None:
        if stream_name == "events":
            for row in rows:
                data = row.data
                if row.type == "ev":
                    self.invalidate_caches_for_event(
                        data.event_id, data.room_id, data.type, data.state_key, data.redacts
                    )
                    self.record_event_position(
                        data.room_id, data.type, data.state_key, instance_name, token
                    )
                elif row.type == "state":
                    self.invalidate_cache_by_name("get_current_state_ids", [data.room_id])
        elif stream_name == "backfill":
            for row in rows:
                self.invalidate_caches_for_event(
                    row.event_id, row.room_id, row.type, row.state_key, row.redacts
                )
        super().process_replication_rows(stream_name, instance_name, token, rows)

    def process_replication_position(
        self, stream_name: str, instance_name: str, token: int
    ) -> None:
        if stream_name == "events":
            self._stream_id_gen.advance(instance_name, token)
        elif stream_name == "backfill":
            # Positive on the wire, negative in the generator.
            self._backfill_id_gen.advance(instance_name, -token)
        super().process_replication_position(stream_name, instance_name, token)
