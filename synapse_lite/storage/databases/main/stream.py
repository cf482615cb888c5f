"""Reading the events stream by position: instance ids for tokens, and rooms'
events between two tokens (sync timelines, /messages pagination)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from synapse_lite.events import Event
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.storage.databases.main.events_worker import (
    EVENT_COLUMNS,
    SERVED,
    EventsWorkerStore,
    event_from_row,
)
from synapse_lite.tokens import RoomStreamToken

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext

logger = logging.getLogger(__name__)

#: Rooms per statement of :meth:`StreamWorkerStore.get_room_events_between_per_room`.
ROOMS_PER_UNION = 50


class StreamWorkerStore(EventsWorkerStore):
    """Stream tokens and room timelines."""

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ):
        super().__init__(database, db_conn, hs)
        self._instance_ids: dict[str, int] = {}
        self._instance_names: dict[int, str] = {}
        with db_conn.transaction("load_stream_instance_ids") as txn:
            for writer in hs.config.writers.writers("events"):
                self._ensure_instance_id_txn(txn, writer)
            txn.execute("SELECT instance_id, instance_name FROM stream_instance_ids")
            for instance_id, name in txn.fetchall():
                self._remember_instance(int(instance_id), name)

    def _remember_instance(self, instance_id: int, name: str) -> None:
        self._instance_ids[name] = instance_id
        self._instance_names[instance_id] = name

    def _ensure_instance_id_txn(self, txn: LoggingTransaction, name: str) -> int:
        txn.execute("SELECT instance_id FROM stream_instance_ids WHERE instance_name = ?", (name,))
        row = txn.fetchone()
        if row:
            return int(row[0])
        (new_id,) = self.database_engine.sequence_next_values(
            txn.raw_cursor, "stream_instance_id_seq", 1
        )
        txn.execute(
            "INSERT INTO stream_instance_ids (instance_id, instance_name) VALUES (?, ?)"
            " ON CONFLICT (instance_name) DO NOTHING",
            (new_id, name),
        )
        txn.execute("SELECT instance_id FROM stream_instance_ids WHERE instance_name = ?", (name,))
        return int(txn.fetchone()[0])

    async def get_id_for_instance(self, name: str) -> int:
        """The short number standing for a writer in tokens."""
        instance_id = self._instance_ids.get(name)
        if instance_id is None:
            instance_id = await self.db_pool.runInteraction(
                "get_id_for_instance", self._ensure_instance_id_txn, name
            )
            self._remember_instance(instance_id, name)
        return instance_id

    async def get_name_from_instance_id(self, instance_id: int) -> str | None:
        name = self._instance_names.get(instance_id)
        if name is None:
            rows = await self.db_pool.select(
                "get_name_from_instance_id",
                "SELECT instance_name FROM stream_instance_ids WHERE instance_id = ?",
                instance_id,
            )
            if not rows:
                return None
            name = rows[0][0]
            self._remember_instance(instance_id, name)
        return name

    async def room_token_to_string(self, token: RoomStreamToken) -> str:
        return await token.to_string(self.get_id_for_instance)

    async def parse_room_token(self, string: str) -> RoomStreamToken:
        return await RoomStreamToken.parse(string, self.get_name_from_instance_id)

    async def get_room_events_between(
        self,
        room_ids: list[str],
        from_token: RoomStreamToken | None,
        to_token: RoomStreamToken,
        limit: int,
        newest_first: bool = True,
        backfilled: bool = False,
    ) -> list[Event]:
        """Events of ``room_ids`` after ``from_token`` (all, if None) and at or
        before ``to_token``, at most ``limit``, in stream order (newest first
        when ``newest_first``). ``backfilled``: with the events of the
        backfill stream (negative stream orderings, before all others:
        ``/messages``), which nothing else that reads the stream shows."""
        if not room_ids:
            return []
        if not backfilled and (from_token is not None or (newest_first and len(room_ids) == 1)):
            # An incremental /sync's range, or a room's newest events: the
            # ids from memory, the events by id (a writer's own are in its
            # cache: no read).
            recent = self.recent_room_events
            ids = (
                recent.between(room_ids, from_token, to_token, limit, newest_first)
                if from_token is not None
                else recent.newest(room_ids[0], to_token, limit)
            )
            if ids is not None:
                found = await self.get_events(ids)
                if len(found) == len(ids):
                    return [found[event_id] for event_id in ids]
        lower = from_token or RoomStreamToken(-(2**62))
        where, args = lower.bounds_sql(to_token, "stream_ordering", "instance_name")
        placeholders = ", ".join("?" for _ in room_ids)
        order = "DESC" if newest_first else "ASC"
        positive = "" if backfilled else " AND stream_ordering > 0"
        sql = (
            f"SELECT {EVENT_COLUMNS} FROM events WHERE room_id IN ({placeholders})"
            f"{positive} AND {SERVED} AND {where}"
            f" ORDER BY stream_ordering {order} LIMIT ?"
        )

        def read(txn: LoggingTransaction) -> tuple[list[Event], dict[str, list[str]]]:
            txn.execute(sql, (*room_ids, *args, limit))
            events = [event_from_row(r) for r in txn.fetchall()]
            return events, self._redactions_of_txn(txn, [e.event_id for e in events])

        drops = self._event_cache_drops
        # The events and their redactions in one interaction: a woken /sync
        # waits for one thread hop, not two. In autocommit (two round trips on
        # PostgreSQL, not four with BEGIN and COMMIT): the redactions are then
        # read at a snapshot no older than the events', which can only apply
        # a redaction committed in between, as a read a moment later would.
        events, by_target = await self.db_pool.runInteraction(
            "get_room_events_between", read, read_only=True, db_autocommit=True
        )
        return await self._served_events(events, by_target, drops)

    async def get_room_events_between_per_room(
        self,
        room_ids: list[str],
        from_token: RoomStreamToken | None,
        to_token: RoomStreamToken,
        limit: int,
    ) -> dict[str, list[Event]]:
        """room -> ``get_room_events_between([room], from_token, to_token,
        limit)`` (newest first) for each of ``room_ids``, in one round trip:
        each room's events are its own index scan with its own ``LIMIT``
        (a ``UNION ALL`` of one subquery a room), so a room's long history
        costs no more than when read alone."""
        result: dict[str, list[Event]] = {r: [] for r in room_ids}
        if not room_ids:
            return result
        # Rooms whose events in the range this process holds (their writer):
        # the ids from memory, the events by id; the rest from the database.
        held = await self._held_room_events(room_ids, from_token, to_token, limit)
        if held:
            result.update(held)
            room_ids = [r for r in room_ids if r not in held]
            if not room_ids:
                return result
        lower = from_token or RoomStreamToken(-(2**62))
        where, args = lower.bounds_sql(to_token, "stream_ordering", "instance_name")
        one = (
            f"SELECT * FROM (SELECT {EVENT_COLUMNS} FROM events WHERE room_id = ?"
            f" AND stream_ordering > 0 AND {SERVED} AND {where}"
            " ORDER BY stream_ordering DESC LIMIT ?) AS r{}"
        )

        def read(txn: LoggingTransaction) -> tuple[list[Event], dict[str, list[str]]]:
            events: list[Event] = []
            for start in range(0, len(room_ids), ROOMS_PER_UNION):
                chunk = room_ids[start : start + ROOMS_PER_UNION]
                txn.execute(
                    " UNION ALL ".join(one.format(i) for i in range(len(chunk))),
                    [a for room_id in chunk for a in (room_id, *args, limit)],
                )
                events.extend(event_from_row(r) for r in txn.fetchall())
            return events, self._redactions_of_txn(txn, [e.event_id for e in events])

        drops = self._event_cache_drops
        events, by_target = await self.db_pool.runInteraction(
            "get_room_events_between_per_room", read, read_only=True
        )
        for event in await self._served_events(events, by_target, drops):
            result[event.room_id].append(event)
        for room_events in result.values():
            room_events.sort(key=lambda e: e.stream_ordering, reverse=True)
        return result

    async def _held_room_events(
        self,
        room_ids: list[str],
        from_token: RoomStreamToken | None,
        to_token: RoomStreamToken,
        limit: int,
    ) -> dict[str, list[Event]]:
        """room -> its newest events in the range (at most ``limit``, newest
        first; no lower bound when ``from_token`` is None) for the rooms of
        ``room_ids`` whose events in the range this process holds
        (``recent_room_events``), read by id; the others are left out."""
        recent = self.recent_room_events
        ids_of: dict[str, list[str]] = {}
        for room_id in room_ids:
            if from_token is None:
                ids = recent.newest(room_id, to_token, limit)
            else:
                ids = recent.between([room_id], from_token, to_token, limit)
            if ids is not None:
                ids_of[room_id] = ids
        if not ids_of:
            return {}
        found = await self.get_events(e for ids in ids_of.values() for e in ids)
        return {
            room_id: [found[e] for e in ids]
            for room_id, ids in ids_of.items()
            if all(e in found for e in ids)
        }

    async def get_membership_changes_in_rooms(
        self, room_ids: list[str], from_token: RoomStreamToken, to_token: RoomStreamToken
    ) -> list[tuple[str, str]]:
        """``(user, membership)`` of every membership event in ``room_ids``
        after ``from_token`` and at or before ``to_token``, oldest first."""
        # Only rooms whose memberships may have changed need the query.
        tracker = self.room_membership_changes
        room_ids = [r for r in room_ids if tracker.may_have_changed(r, from_token)]
        if not room_ids:
            return []
        where, args = from_token.bounds_sql(to_token, "stream_ordering", "instance_name")
        placeholders = ", ".join("?" for _ in room_ids)
        rows = await self.db_pool.select(
            "get_membership_changes_in_rooms",
            f"SELECT state_key, membership FROM events WHERE room_id IN ({placeholders})"
            f" AND type = 'm.room.member' AND stream_ordering > 0 AND {SERVED} AND {where}"
            " ORDER BY stream_ordering ASC",
            *room_ids,
            *args,
        )
        return [(r[0], r[1]) for r in rows]

    async def get_state_events_between(
        self, room_id: str, from_token: RoomStreamToken, to_token: RoomStreamToken
    ) -> list[Event]:
        """State events of a room after ``from_token`` and at or before
        ``to_token``, oldest first."""
        where, args = from_token.bounds_sql(to_token, "stream_ordering", "instance_name")
        rows = await self.db_pool.select(
            "get_state_events_between",
            f"SELECT {EVENT_COLUMNS} FROM events WHERE room_id = ? AND state_key IS NOT NULL"
            f" AND stream_ordering > 0 AND {SERVED} AND {where} ORDER BY stream_ordering ASC",
            room_id,
            *args,
        )
        return await self.with_redactions([event_from_row(r) for r in rows])
