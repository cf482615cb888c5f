"""Read receipts: the latest receipt per (room, type, user), on the receipts stream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder, page_of_updates
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.streams.catalog import ReceiptsStreamRow

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext


class ReceiptsWorkerStore(SQLBaseStore):
    """Receipts: reads anywhere, writes on the receipts writer."""

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ):
        super().__init__(database, db_conn, hs)
        self._receipts_id_gen = hs.id_generators.of("receipts")
        self.receipt_changes = self.track_stream_changes(
            "receipts", self._receipts_id_gen.persisted_upto_position
        )

    async def insert_receipt(
        self,
        room_id: str,
        receipt_type: str,
        user_id: str,
        event_id: str,
        data: dict[str, Any],
        thread_id: str | None = None,
    ) -> int | None:
        """Record a user's latest receipt in a room; returns its stream id.
        A receipt only moves forward: one for an event at or before the one
        the user's receipt of that type is at already is ignored (None)."""

        def txn_func(txn: LoggingTransaction) -> int | None:
            txn.execute(
                "SELECT old.stream_ordering, new.stream_ordering FROM receipts_linearized AS r"
                " JOIN events AS old ON old.event_id = r.event_id"
                " JOIN events AS new ON new.event_id = ?"
                " WHERE r.room_id = ? AND r.receipt_type = ? AND r.user_id = ?",
                (event_id, room_id, receipt_type, user_id),
            )
            row = txn.fetchone()
            if row is not None and int(row[1]) <= int(row[0]):
                return None
            stream_id = self._receipts_id_gen.get_next_txn(txn)
            self.receipt_changes.record_after_commit(txn, room_id, stream_id)
            txn.execute(
                "INSERT INTO receipts_linearized (stream_id, instance_name, room_id, receipt_type,"
                " user_id, event_id, thread_id, data) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (room_id, receipt_type, user_id) DO UPDATE SET"
                " stream_id = EXCLUDED.stream_id, instance_name = EXCLUDED.instance_name,"
                " event_id = EXCLUDED.event_id, thread_id = EXCLUDED.thread_id,"
                " data = EXCLUDED.data",
                (
                    stream_id,
                    self._instance_name,
                    room_id,
                    receipt_type,
                    user_id,
                    event_id,
                    thread_id,
                    json_encoder(data),
                ),
            )
            return stream_id

        # An upsert of one row per key: a second run stores the same receipt.
        return await self.db_pool.runInteraction("insert_receipt", txn_func, idempotent=True)

    async def get_receipts_for_rooms(
        self, room_ids: list[str], from_id: int | None, to_id: int
    ) -> list[tuple[str, str, str, str, dict[str, Any]]]:
        """Receipts in rooms with stream ids in ``(from_id, to_id]`` (all up to
        ``to_id`` when ``from_id`` is None): ``(room_id, receipt_type, user_id,
        event_id, data)``."""
        if not room_ids:
            return []
        placeholders = ", ".join("?" for _ in room_ids)
        rows = await self.db_pool.select(
            "get_receipts_for_rooms",
            "SELECT room_id, receipt_type, user_id, event_id, data FROM receipts_linearized"
            f" WHERE room_id IN ({placeholders}) AND stream_id > ? AND stream_id <= ?",
            *room_ids,
            -1 if from_id is None else from_id,
            to_id,
        )
        return [(r[0], r[1], r[2], r[3], db_to_json(r[4])) for r in rows]

    def get_receipts_position(self) -> int:
        """Where every receipt up to is stored (this process's view)."""
        return self._receipts_id_gen.persisted_upto_position()

    async def get_public_receipts_between(
        self, from_id: int, to_id: int, limit: int
    ) -> list[tuple[int, str, str, str, str | None, dict[str, Any]]]:
        """``m.read`` receipts with stream ids in ``(from_id, to_id]``, oldest
        first, at most ``limit``: ``(stream_id, room_id, user_id, event_id,
        thread_id, data)`` (what other servers are sent)."""
        rows = await self.db_pool.select(
            "get_public_receipts_between",
            "SELECT stream_id, room_id, user_id, event_id, thread_id, data FROM receipts_linearized"
            " WHERE ? < stream_id AND stream_id <= ? AND receipt_type = 'm.read'"
            " ORDER BY stream_id ASC LIMIT ?",
            from_id,
            to_id,
            limit,
        )
        return [(int(r[0]), r[1], r[2], r[3], r[4], db_to_json(r[5])) for r in rows]

    async def get_readers_between(self, from_id: int, to_id: int) -> set[str]:
        """Users who moved a read receipt (``m.read`` or private) with a
        stream id in ``(from_id, to_id]``."""
        rows = await self.db_pool.select(
            "get_readers_between",
            "SELECT DISTINCT user_id FROM receipts_linearized WHERE ? < stream_id"
            " AND stream_id <= ? AND receipt_type IN ('m.read', 'm.read.private')",
            from_id,
            to_id,
        )
        return {r[0] for r in rows}

    async def get_all_updated_receipts(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[int, ReceiptsStreamRow]], int, bool]:
        """The receipts stream's update function."""
        rows = await self.db_pool.select(
            "get_all_updated_receipts",
            "SELECT stream_id, room_id, receipt_type, user_id, event_id, thread_id, data"
            " FROM receipts_linearized WHERE ? < stream_id AND stream_id <= ?"
            " AND instance_name = ? ORDER BY stream_id ASC LIMIT ?",
            last_id,
            current_id,
            instance_name,
            limit,
        )
        updates = [
            (
                int(r[0]),
                ReceiptsStreamRow(
                    room_id=r[1],
                    receipt_type=r[2],
                    user_id=r[3],
                    event_id=r[4],
                    thread_id=r[5],
                    data=db_to_json(r[6]),
                ),
            )
            for r in rows
        ]
        return page_of_updates(updates, limit, current_id)
