"""Sliding sync (``sliding_sync_positions``): the connection state saved
with each ``pos`` (plain rows any process writes), and the reads of the room
list: activity order, room kinds, member counts."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import attr

from synapse_lite.storage._base import SQLBaseStore, db_to_json
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.events_worker import SERVED
from synapse_lite.tokens import RoomStreamToken

#: Room ids per query (SQLite's limit on placeholders is far above).
CHUNK = 500
#: The event types that move a room's ``bump_stamp`` (the MSC's list).
BUMP_EVENT_TYPES = (
    "m.room.create",
    "m.room.message",
    "m.room.encrypted",
    "m.sticker",
    "m.call.invite",
    "m.poll.start",
    "m.beacon_info",
)
#: Connections kept per device: the oldest beyond are dropped (the MSC asks
#: servers to bound what a device can make them store).
MAX_CONNECTIONS_PER_DEVICE = 20


@attr.s(slots=True, frozen=True, auto_attribs=True)
class SavedPosition:
    user_id: str
    device_id: str
    conn_id: str
    stream_token: str
    state: str
    created_ts: int


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


class SlidingSyncWorkerStore(SQLBaseStore):
    async def get_sliding_sync_position(self, pos: str) -> SavedPosition | None:
        rows = await self.db_pool.select(
            "get_sliding_sync_position",
            "SELECT user_id, device_id, conn_id, stream_token, state, created_ts"
            " FROM sliding_sync_positions WHERE pos = ?",
            pos,
        )
        if not rows:
            return None
        r = rows[0]
        return SavedPosition(r[0], r[1], r[2], r[3], r[4], int(r[5]))

    async def save_sliding_sync_position(
        self,
        pos: str,
        user_id: str,
        device_id: str,
        conn_id: str,
        stream_token: str,
        state: str,
        now_ms: int,
        used_pos: str | None,
        expire_before_ms: int | None = None,
    ) -> None:
        """Save the new ``pos`` of a connection and drop its older ones: all
        but ``used_pos`` (the one the client sent: it may retry with it), or
        every one when the client started over (``used_pos`` None); with
        ``expire_before_ms``, also the user's connections last used before
        it (in the same round trip)."""

        def save(txn: LoggingTransaction) -> None:
            if expire_before_ms is not None:
                txn.execute(
                    "DELETE FROM sliding_sync_positions WHERE user_id = ? AND created_ts < ?",
                    (user_id, expire_before_ms),
                )
            txn.execute(
                "DELETE FROM sliding_sync_positions"
                " WHERE user_id = ? AND device_id = ? AND conn_id = ? AND pos != ?",
                (user_id, device_id, conn_id, used_pos or ""),
            )
            txn.execute(
                "INSERT INTO sliding_sync_positions"
                " (pos, user_id, device_id, conn_id, stream_token, state, created_ts)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (pos, user_id, device_id, conn_id, stream_token, state, now_ms),
            )
            if used_pos is None:
                txn.execute(
                    "SELECT conn_id, MAX(created_ts) FROM sliding_sync_positions"
                    " WHERE user_id = ? AND device_id = ? GROUP BY conn_id",
                    (user_id, device_id),
                )
                newest_first = sorted(txn.fetchall(), key=lambda r: -int(r[1]))
                for old_conn, _ in newest_first[MAX_CONNECTIONS_PER_DEVICE:]:
                    txn.execute(
                        "DELETE FROM sliding_sync_positions"
                        " WHERE user_id = ? AND device_id = ? AND conn_id = ?",
                        (user_id, device_id, old_conn),
                    )

        await self.db_pool.runInteraction("save_sliding_sync_position", save)

    async def get_room_activity(
        self, room_ids: Sequence[str], upto: RoomStreamToken
    ) -> dict[str, tuple[int, int]]:
        """room -> (position of its latest event, of its latest event of a
        :data:`BUMP_EVENT_TYPES` type, 0 if none), up to ``upto``. Rooms
        with no such events are left out."""
        where, args = RoomStreamToken(0).bounds_sql(upto, "stream_ordering", "instance_name")
        types = ", ".join("?" for _ in BUMP_EVENT_TYPES)
        result: dict[str, tuple[int, int]] = {}

        def read(txn: LoggingTransaction) -> None:
            # Both maxima of a room in one scan of its rows, the chunks in
            # one interaction: one round trip for the user's rooms.
            for chunk in _chunks(room_ids):
                marks = ", ".join("?" for _ in chunk)
                txn.execute(
                    "SELECT room_id, MAX(stream_ordering),"
                    f" MAX(CASE WHEN type IN ({types}) THEN stream_ordering END)"
                    f" FROM events WHERE room_id IN ({marks}) AND {SERVED} AND {where}"
                    " GROUP BY room_id",
                    (*BUMP_EVENT_TYPES, *chunk, *args),
                )
                for room_id, latest, bump in txn.fetchall():
                    result[room_id] = (int(latest), int(bump or 0))

        await self.db_pool.runInteraction("get_room_activity", read, read_only=True)
        return result

    async def get_room_kinds(self, room_ids: Sequence[str]) -> dict[str, tuple[str | None, bool]]:
        """room -> (its type from the create event, whether it is encrypted
        now), for the rooms whose current state this server has."""
        result: dict[str, tuple[str | None, bool]] = {}
        for chunk in _chunks(room_ids):
            marks = ", ".join("?" for _ in chunk)
            rows = await self.db_pool.select(
                "get_room_kinds",
                "SELECT c.room_id, c.type, e.content FROM current_state_events AS c"
                " JOIN events AS e ON e.event_id = c.event_id"
                f" WHERE c.room_id IN ({marks}) AND c.state_key = ''"
                " AND c.type IN ('m.room.create', 'm.room.encryption')",
                *chunk,
            )
            for room_id, event_type, content in rows:
                room_type, encrypted = result.get(room_id, (None, False))
                if event_type == "m.room.encryption":
                    encrypted = True
                else:
                    value = db_to_json(content).get("type")
                    room_type = value if isinstance(value, str) else None
                result[room_id] = (room_type, encrypted)
        return result

    async def get_member_counts(self, room_ids: Sequence[str]) -> dict[str, tuple[int, int]]:
        """room -> (joined members, invited members), from current state."""
        result: dict[str, tuple[int, int]] = {r: (0, 0) for r in room_ids}
        for chunk in _chunks(room_ids):
            marks = ", ".join("?" for _ in chunk)
            rows = await self.db_pool.select(
                "get_member_counts",
                "SELECT room_id, membership, COUNT(*) FROM current_state_events"
                f" WHERE room_id IN ({marks}) AND type = 'm.room.member'"
                " AND membership IN ('join', 'invite') GROUP BY room_id, membership",
                *chunk,
            )
            for room_id, membership, count in rows:
                joined, invited = result[room_id]
                if membership == "join":
                    joined = int(count)
                else:
                    invited = int(count)
                result[room_id] = (joined, invited)
        return result

    async def get_state_deletions_between(
        self, room_id: str, from_token: RoomStreamToken, to_token: RoomStreamToken
    ) -> set[tuple[str, str]]:
        """The (type, state_key)s the room's current state lost after
        ``from_token`` and still lacked at ``to_token``: keys whose last
        change in between removed them (state resolution, a state reset),
        from ``current_state_delta_stream``."""
        where, args = from_token.bounds_sql(to_token, "stream_id", "instance_name")
        rows = await self.db_pool.select(
            "get_state_deletions_between",
            "SELECT type, state_key, event_id FROM current_state_delta_stream"
            f" WHERE room_id = ? AND {where} ORDER BY stream_id ASC",
            room_id,
            *args,
        )
        last: dict[tuple[str, str], str | None] = {}
        for event_type, state_key, event_id in rows:
            last[(str(event_type), str(state_key))] = event_id
        return {key for key, event_id in last.items() if event_id is None}
