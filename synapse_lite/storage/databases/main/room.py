"""Rooms, their current state, and which events writer persists each room."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from synapse_lite.events import Event
from synapse_lite.storage._base import db_to_json
from synapse_lite.storage.caches import cached
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.events_worker import (
    EVENT_COLUMNS,
    SERVED,
    event_from_row,
)
from synapse_lite.storage.databases.main.roommember import RoomMemberWorkerStore
from synapse_lite.tokens import RoomStreamToken

logger = logging.getLogger(__name__)

#: The cache other processes invalidate when a room moves to another writer.
EVENT_WRITER_CACHE = "get_event_writer_for_room"


class RoomWorkerStore(RoomMemberWorkerStore):
    """Room records and current state reads."""

    async def get_room(self, room_id: str) -> dict[str, Any] | None:
        rows = await self.db_pool.select(
            "get_room",
            "SELECT room_id, creator, is_public, room_version, creation_ts, event_writer"
            " FROM rooms WHERE room_id = ?",
            room_id,
        )
        if not rows:
            return None
        r = rows[0]
        return {
            "room_id": r[0],
            "creator": r[1],
            "is_public": bool(r[2]),
            "room_version": r[3],
            "creation_ts": int(r[4]),
            "event_writer": r[5],
        }

    @cached()
    async def get_current_state_ids(self, room_id: str) -> dict[tuple[str, str], str]:
        """The room's current state: (type, state_key) -> event_id."""
        rows = await self.db_pool.select(
            "get_current_state_ids",
            "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?",
            room_id,
        )
        return {(r[0], r[1]): r[2] for r in rows}

    @cached()
    async def get_history_visibility_settings(
        self, room_id: str
    ) -> tuple[tuple[int, str | None], ...]:
        """Every ``m.room.history_visibility`` event of a room, oldest first:
        ``(stream_ordering, history_visibility)`` (None where the content has
        no string there). A room's events are persisted in stream order by its
        one writer, so the setting in force at an event is the last one
        before it. Read through the partial index ``events_history_visibility``;
        forgotten with the room's other state caches when its state changes."""
        rows = await self.db_pool.select(
            "get_history_visibility_settings",
            "SELECT stream_ordering, content FROM events"
            " WHERE room_id = ? AND type = 'm.room.history_visibility' AND state_key = ''"
            f" AND stream_ordering > 0 AND {SERVED} ORDER BY stream_ordering",
            room_id,
        )
        settings = []
        for position, content in rows:
            value = db_to_json(content).get("history_visibility")
            settings.append((int(position), value if isinstance(value, str) else None))
        return tuple(settings)

    async def get_state_at(self, room_id: str, token: RoomStreamToken) -> list[Event]:
        """A room's state as of ``token``: the latest event of each (type,
        state_key) at or before it."""
        state_ids = await self.get_current_state_ids(room_id)
        events = await self.get_events(state_ids.values())
        if all(token.contains(e.instance_name, e.stream_ordering) for e in events.values()):
            return list(events.values())
        # Current state has moved past the token: rebuild it from the room's
        # state events up to the token.
        where, args = RoomStreamToken(-(2**62)).bounds_sql(
            token, "stream_ordering", "instance_name"
        )
        rows = await self.db_pool.select(
            "get_state_at",
            f"SELECT {EVENT_COLUMNS} FROM events WHERE room_id = ? AND state_key IS NOT NULL"
            f" AND stream_ordering > 0 AND {SERVED} AND {where} ORDER BY stream_ordering ASC",
            room_id,
            *args,
        )
        latest: dict[tuple[str, str], Event] = {}
        for row in rows:
            event = event_from_row(row)
            assert event.state_key is not None
            latest[(event.type, event.state_key)] = event
        return await self.with_redactions(list(latest.values()))

    # Which writer persists a room's events

    @cached(max_entries=100_000)
    async def _get_event_writer_for_room(self, room_id: str) -> tuple[bool, str | None]:
        rows = await self.db_pool.select(
            "get_event_writer_for_room", "SELECT event_writer FROM rooms WHERE room_id = ?", room_id
        )
        return (True, rows[0][0]) if rows else (False, None)

    async def room_exists(self, room_id: str) -> bool:
        exists, _ = await self._get_event_writer_for_room(room_id)
        if not exists:
            # Not cached as missing: the room may be created in a moment.
            self._get_event_writer_for_room.invalidate(room_id)
        return exists

    async def get_event_writer_for_room(self, room_id: str, writers: Sequence[str]) -> str | None:
        """The events writer of an existing room, or None if there is no such room.

        A room created before writers were recorded (NULL) gets the stable hash
        over ``writers`` (the events writers this process knows of); the main
        process assigns such rooms for good at startup
        (:meth:`reassign_rooms_of_removed_writers`).
        """
        exists, writer = await self._get_event_writer_for_room(room_id)
        if not exists:
            # Not cached as missing: the room may be created in a moment.
            self._get_event_writer_for_room.invalidate(room_id)
            return None
        if writer is None:
            return self.hs.config.writers.writer_for("events", room_id, among=writers)
        return writer

    def invalidate_event_writer(self, room_id: str | None) -> None:
        """Forget the cached writer of a room (of every room when None)."""
        if room_id is None:
            self._get_event_writer_for_room.invalidate_all()
        else:
            self._get_event_writer_for_room.invalidate(room_id)

    async def reassign_rooms_of_removed_writers(self, writers: Sequence[str]) -> int:
        """Give every room whose writer is not in ``writers`` (or unrecorded) a
        new one by the stable hash over ``writers``, and tell other processes
        through the caches stream. Main process, at startup. Returns how many
        rooms moved."""

        def txn_func(txn: LoggingTransaction) -> list[tuple[str, str]]:
            placeholders = ", ".join("?" for _ in writers)
            txn.execute(
                "SELECT room_id FROM rooms WHERE event_writer IS NULL"
                f" OR event_writer NOT IN ({placeholders})",
                tuple(writers),
            )
            moves = [
                (r[0], self.hs.config.writers.writer_for("events", r[0], among=writers))
                for r in txn.fetchall()
            ]
            txn.execute_batch(
                "UPDATE rooms SET event_writer = ? WHERE room_id = ?",
                [(writer, room_id) for room_id, writer in moves],
            )
            # Invalidations are one row per room: bounded by the rooms moved,
            # and each names only what changed.
            for room_id, _ in moves:
                self.send_invalidation_txn(txn, EVENT_WRITER_CACHE, [room_id])
            return moves

        moves = await self.db_pool.runInteraction("reassign_rooms_of_removed_writers", txn_func)
        for room_id, writer in moves:
            self.invalidate_event_writer(room_id)
            logger.info("Room %s now has its events persisted by %s", room_id, writer)
        return len(moves)

    def invalidate_cache_by_name(self, name: str, keys: list[Any] | None) -> None:
        # The public name of the writer lookup is what other processes send.
        if name == EVENT_WRITER_CACHE:
            self.invalidate_event_writer(None if keys is None else keys[0])
            return
        super().invalidate_cache_by_name(name, keys)
