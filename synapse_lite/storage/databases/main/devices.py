"""Devices of local users and the device_lists stream of their changes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.storage._base import SQLBaseStore
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.storage.databases.main.client_transactions import (
    delete_device_client_transactions_txn,
)
from synapse_lite.streams.catalog import DeviceListsStreamRow

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext


class DeviceWorkerStore(SQLBaseStore):
    """Device reads anywhere; device changes are written by the main process."""

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ):
        super().__init__(database, db_conn, hs)
        self._device_list_id_gen = hs.id_generators.of("device_lists")
        self.device_list_changes = self.track_stream_changes(
            "device_lists", self._device_list_id_gen.persisted_upto_position
        )

    def get_device_lists_position(self) -> int:
        """Where every device list change up to is stored (this process's view)."""
        return self._device_list_id_gen.persisted_upto_position()

    async def get_devices_by_user(self, user_id: str) -> list[dict[str, Any]]:
        rows = await self.db_pool.select(
            "get_devices_by_user",
            "SELECT device_id, display_name, created_ts FROM devices WHERE user_id = ?"
            " ORDER BY device_id",
            user_id,
        )
        return [
            {"user_id": user_id, "device_id": r[0], "display_name": r[1], "created_ts": int(r[2])}
            for r in rows
        ]

    async def get_device_ids(self, user_id: str) -> list[str]:
        rows = await self.db_pool.select(
            "get_device_ids", "SELECT device_id FROM devices WHERE user_id = ?", user_id
        )
        return [r[0] for r in rows]

    async def get_device(self, user_id: str, device_id: str) -> dict[str, Any] | None:
        rows = await self.db_pool.select(
            "get_device",
            "SELECT display_name, created_ts FROM devices WHERE user_id = ? AND device_id = ?",
            user_id,
            device_id,
        )
        if not rows:
            return None
        return {
            "user_id": user_id,
            "device_id": device_id,
            "display_name": rows[0][0],
            "created_ts": int(rows[0][1]),
        }

    def delete_device_txn(self, txn: LoggingTransaction, user_id: str, device_id: str) -> bool:
        """Delete a device and its keys, recording the change on the
        device_lists stream. Returns whether it existed. On the user's
        device_lists writer only."""
        # Its client transaction ids too: nobody can retry with them any more.
        delete_device_client_transactions_txn(txn, user_id, device_id)
        txn.execute("DELETE FROM devices WHERE user_id = ? AND device_id = ?", (user_id, device_id))
        if txn.rowcount == 0:
            return False
        # Its keys go with it: a deleted device must not be sent messages.
        for table in ("e2e_device_keys_json", "e2e_one_time_keys_json", "e2e_fallback_keys_json"):
            txn.execute(
                f"DELETE FROM {table} WHERE user_id = ? AND device_id = ?", (user_id, device_id)
            )
        txn.execute(
            "DELETE FROM e2e_cross_signing_signatures"
            " WHERE target_user_id = ? AND target_device_id = ?",
            (user_id, device_id),
        )
        self.add_device_change_txn(txn, user_id, device_id)
        return True

    async def set_device_display_name(
        self, user_id: str, device_id: str, display_name: str | None
    ) -> int | None:
        """Rename a device, announced on the device_lists stream. Returns
        the stream id written, None when there is no such device. On the
        device_lists writer only."""

        def txn_func(txn: LoggingTransaction) -> int | None:
            txn.execute(
                "UPDATE devices SET display_name = ? WHERE user_id = ? AND device_id = ?",
                (display_name, user_id, device_id),
            )
            if txn.rowcount == 0:
                return None
            return self.add_device_change_txn(txn, user_id, device_id)

        return await self.db_pool.runInteraction("set_device_display_name", txn_func)

    def store_device_txn(
        self, txn: LoggingTransaction, user_id: str, device_id: str, display_name: str | None
    ) -> bool:
        """Create a device if it is new, recording the change on the
        device_lists stream. Returns whether it was new. On the user's
        device_lists writer only."""
        txn.execute(
            "INSERT INTO devices (user_id, device_id, display_name, created_ts)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (user_id, device_id) DO NOTHING",
            (user_id, device_id, display_name, self.clock.time_msec()),
        )
        if txn.rowcount == 0:
            return False
        self.add_device_change_txn(txn, user_id, device_id)
        return True

    def add_device_change_txn(self, txn: LoggingTransaction, user_id: str, device_id: str) -> int:
        return self.add_device_changes_txn(txn, user_id, [device_id])

    def add_device_changes_txn(
        self,
        txn: LoggingTransaction,
        user_id: str,
        device_ids: list[str],
        visible_to: str | None = None,
    ) -> int:
        """Record one change of ``user_id``'s devices, touching ``device_ids``
        (one device_lists id, on a row for each), told to ``visible_to``
        only when given. Returns the id."""
        stream_id = self._device_list_id_gen.get_next_txn(txn)
        self.device_list_changes.record_after_commit(txn, user_id, stream_id)
        for device_id in device_ids:
            txn.execute(
                "INSERT INTO device_lists_stream"
                " (stream_id, user_id, device_id, instance_name, visible_to)"
                " VALUES (?, ?, ?, ?, ?)",
                (stream_id, user_id, device_id, self._instance_name, visible_to),
            )
        return stream_id

    async def get_users_whose_devices_changed(
        self, from_id: int, to_id: int, viewer: str
    ) -> set[str]:
        """Users with a device_lists change in ``(from_id, to_id]`` (devices or
        device keys, or cross-signing keys) that ``viewer`` is told of: a
        user-signing key is its owner's business only, and so is a change
        made for one user (``visible_to``)."""
        rows = await self.db_pool.select(
            "get_users_whose_devices_changed",
            "SELECT user_id FROM device_lists_stream WHERE stream_id > ? AND stream_id <= ?"
            " AND (visible_to IS NULL OR visible_to = ?)"
            " UNION SELECT user_id FROM e2e_cross_signing_keys"
            " WHERE stream_id > ? AND stream_id <= ?"
            " AND (keytype != 'user_signing' OR user_id = ?)",
            from_id,
            to_id,
            viewer,
            from_id,
            to_id,
            viewer,
        )
        return {r[0] for r in rows}

    async def get_all_device_list_changes(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[int, Any]], int, bool]:
        """The device_lists stream's update function: the rows of both its
        tables. Rows sharing an id are never split across pages: a full page
        ends before its last id's rows (or, when they are all one id, holds
        every row of that id)."""
        select = (
            "SELECT stream_id, user_id, device_id FROM ("
            " SELECT stream_id, user_id, device_id FROM device_lists_stream"
            "  WHERE ? < stream_id AND stream_id <= ? AND instance_name = ?"
            " UNION ALL"
            " SELECT stream_id, user_id, keytype FROM e2e_cross_signing_keys"
            "  WHERE ? < stream_id AND stream_id <= ? AND instance_name = ?"
            ") AS changes ORDER BY stream_id ASC"
        )

        def txn_func(txn: LoggingTransaction) -> tuple[list[tuple[int, Any]], int, bool]:
            txn.execute(select + " LIMIT ?", (last_id, current_id, instance_name) * 2 + (limit,))
            rows = txn.fetchall()
            if len(rows) < limit:
                return _device_list_rows(rows), current_id, False
            last = int(rows[-1][0])
            if int(rows[0][0]) != last:
                kept = [r for r in rows if int(r[0]) != last]
                return _device_list_rows(kept), int(kept[-1][0]), True
            txn.execute(select, (last - 1, last, instance_name) * 2)
            return _device_list_rows(txn.fetchall()), last, True

        return await self.db_pool.runInteraction(
            "get_all_device_list_changes", txn_func, read_only=True
        )


def _device_list_rows(rows: list[Any]) -> list[tuple[int, Any]]:
    return [(int(r[0]), DeviceListsStreamRow(user_id=r[1], device_id=r[2])) for r in rows]
