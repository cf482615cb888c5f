"""Other servers' users' device lists and cross-signing keys (delta 0150),
kept current by their EDUs (``handlers/remote_devices.py``), and the
reads of our own users' device lists that other servers are served.

Every change of a remote user's list is also a row on the device_lists
stream for that user (``add_device_changes_txn``), in the same transaction,
so our users' /sync lists them under ``device_lists.changed``; the writes
therefore run on the user's device_lists writer.
"""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.devices import DeviceWorkerStore


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RemoteDevice:
    """One device of a remote user as its server described it."""

    device_id: str
    display_name: str | None
    #: Its signed device keys, None when it uploaded none.
    keys: dict[str, Any] | None


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RemoteListState:
    """Where our copy of a remote user's list stands."""

    #: The origin's device list stream id our copy is current at.
    stream_id: int
    #: An update was missed: fetch the whole list before serving it.
    stale: bool


class RemoteDevicesWorkerStore(DeviceWorkerStore, SQLBaseStore):
    """Reads anywhere; writes on the user's device_lists writer."""

    async def get_remote_device_list_state(self, user_id: str) -> RemoteListState | None:
        """None when we keep no copy of ``user_id``'s list."""
        rows = await self.db_pool.select(
            "get_remote_device_list_state",
            "SELECT stream_id, stale FROM remote_device_list_users WHERE user_id = ?",
            user_id,
        )
        if not rows:
            return None
        return RemoteListState(int(rows[0][0]), bool(rows[0][1]))

    async def get_rooms_shared_with_local_users(self, user_id: str) -> list[str]:
        """Rooms where ``user_id`` (of another server) and one of our users
        are joined now."""
        rows = await self.db_pool.select(
            "get_rooms_shared_with_local_users",
            "SELECT DISTINCT c.room_id FROM current_state_events AS c"
            " JOIN local_current_membership AS l"
            " ON l.room_id = c.room_id AND l.membership = 'join'"
            " WHERE c.type = 'm.room.member' AND c.state_key = ? AND c.membership = 'join'",
            user_id,
        )
        return sorted(r[0] for r in rows)

    async def get_remote_devices(self, user_id: str) -> list[RemoteDevice]:
        """Our copy of ``user_id``'s devices, by device id."""
        rows = await self.db_pool.select(
            "get_remote_devices",
            "SELECT device_id, display_name, keys FROM remote_devices WHERE user_id = ?"
            " ORDER BY device_id",
            user_id,
        )
        return [RemoteDevice(r[0], r[1], db_to_json(r[2]) if r[2] else None) for r in rows]

    async def get_remote_cross_signing_keys(self, user_id: str) -> dict[str, dict[str, Any]]:
        """Our copy of ``user_id``'s ``master`` and ``self_signing`` keys."""
        rows = await self.db_pool.select(
            "get_remote_cross_signing_keys",
            "SELECT keytype, key_json FROM remote_cross_signing_keys WHERE user_id = ?",
            user_id,
        )
        return {r[0]: db_to_json(r[1]) for r in rows}

    async def replace_remote_device_list(
        self,
        user_id: str,
        stream_id: int,
        devices: list[RemoteDevice],
        cross_signing: dict[str, dict[str, Any]],
    ) -> int:
        """Our copy of ``user_id``'s list becomes ``devices`` (and these
        cross-signing keys), current at ``stream_id``; announced on the
        device_lists stream. Returns the id written."""

        def txn_func(txn: LoggingTransaction) -> int:
            txn.execute("DELETE FROM remote_devices WHERE user_id = ?", (user_id,))
            for device in devices:
                self._insert_remote_device_txn(txn, user_id, device)
            txn.execute("DELETE FROM remote_cross_signing_keys WHERE user_id = ?", (user_id,))
            for keytype, key in cross_signing.items():
                self._upsert_remote_key_txn(txn, user_id, keytype, key)
            self._set_remote_state_txn(txn, user_id, stream_id, stale=False)
            return self.add_device_changes_txn(
                txn, user_id, [d.device_id for d in devices] or ["*"]
            )

        return await self.db_pool.runInteraction("replace_remote_device_list", txn_func)

    async def update_remote_device(
        self, user_id: str, stream_id: int, device: RemoteDevice, deleted: bool
    ) -> int:
        """One device of a list we keep changed (or was ``deleted``); the
        list is now current at ``stream_id``. Returns the device_lists id."""

        def txn_func(txn: LoggingTransaction) -> int:
            txn.execute(
                "DELETE FROM remote_devices WHERE user_id = ? AND device_id = ?",
                (user_id, device.device_id),
            )
            if not deleted:
                self._insert_remote_device_txn(txn, user_id, device)
            self._set_remote_state_txn(txn, user_id, stream_id, stale=False)
            return self.add_device_changes_txn(txn, user_id, [device.device_id])

        return await self.db_pool.runInteraction("update_remote_device", txn_func)

    async def set_remote_cross_signing_keys(
        self, user_id: str, keys: dict[str, dict[str, Any]]
    ) -> int:
        """Replace these cross-signing keys of a remote user whose list we
        keep; announced on the device_lists stream (one row per key type)."""

        def txn_func(txn: LoggingTransaction) -> int:
            for keytype, key in keys.items():
                self._upsert_remote_key_txn(txn, user_id, keytype, key)
            return self.add_device_changes_txn(txn, user_id, sorted(keys))

        return await self.db_pool.runInteraction("set_remote_cross_signing_keys", txn_func)

    async def note_remote_device_change(
        self, user_id: str, device_ids: list[str], stale: bool
    ) -> int:
        """A remote user's devices changed and we keep no usable copy:
        announce it on the device_lists stream (so clients ask again), and,
        when ``stale``, mark a copy we keep as needing a full fetch."""

        def txn_func(txn: LoggingTransaction) -> int:
            if stale:
                txn.execute(
                    "UPDATE remote_device_list_users SET stale = 1 WHERE user_id = ?", (user_id,)
                )
            return self.add_device_changes_txn(txn, user_id, device_ids or ["*"])

        return await self.db_pool.runInteraction("note_remote_device_change", txn_func)

    def _insert_remote_device_txn(
        self, txn: LoggingTransaction, user_id: str, device: RemoteDevice
    ) -> None:
        txn.execute(
            "INSERT INTO remote_devices (user_id, device_id, display_name, keys)"
            " VALUES (?, ?, ?, ?)",
            (
                user_id,
                device.device_id,
                device.display_name,
                None if device.keys is None else json_encoder(device.keys),
            ),
        )

    def _upsert_remote_key_txn(
        self, txn: LoggingTransaction, user_id: str, keytype: str, key: dict[str, Any]
    ) -> None:
        txn.execute(
            "INSERT INTO remote_cross_signing_keys (user_id, keytype, key_json) VALUES (?, ?, ?)"
            " ON CONFLICT (user_id, keytype) DO UPDATE SET key_json = EXCLUDED.key_json",
            (user_id, keytype, json_encoder(key)),
        )

    def _set_remote_state_txn(
        self, txn: LoggingTransaction, user_id: str, stream_id: int, stale: bool
    ) -> None:
        txn.execute(
            "INSERT INTO remote_device_list_users (user_id, stream_id, stale, updated_ts)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (user_id) DO UPDATE SET"
            " stream_id = EXCLUDED.stream_id, stale = EXCLUDED.stale,"
            " updated_ts = EXCLUDED.updated_ts",
            (user_id, stream_id, 1 if stale else 0, self.clock.time_msec()),
        )

    # Our users' lists, as other servers are told of them.

    async def get_device_list_stream_id(self, user_id: str, before: int | None = None) -> int:
        """The latest device_lists id of a change of ``user_id``'s devices
        that everyone is told of (below ``before`` when given); 0 when none."""
        rows = await self.db_pool.select(
            "get_device_list_stream_id",
            "SELECT MAX(stream_id) FROM device_lists_stream WHERE user_id = ?"
            " AND visible_to IS NULL AND stream_id < ?",
            user_id,
            (1 << 62) if before is None else before,
        )
        return int(rows[0][0]) if rows and rows[0][0] is not None else 0

    async def get_device_list_changes_between(
        self, from_id: int, to_id: int, limit: int
    ) -> list[tuple[int, str, str, bool]]:
        """Changes everyone is told of with ids in ``(from_id, to_id]``,
        oldest first, at most ``limit``: ``(stream_id, user_id, device_id,
        False)`` from device changes, ``(stream_id, user_id, key type,
        True)`` from cross-signing keys (``master``, ``self_signing``; never
        ``user_signing``)."""
        rows = await self.db_pool.select(
            "get_device_list_changes_between",
            "SELECT stream_id, user_id, device_id, is_key FROM ("
            " SELECT stream_id, user_id, device_id, 0 AS is_key FROM device_lists_stream"
            "  WHERE ? < stream_id AND stream_id <= ? AND visible_to IS NULL"
            " UNION ALL"
            " SELECT stream_id, user_id, keytype, 1 AS is_key FROM e2e_cross_signing_keys"
            "  WHERE ? < stream_id AND stream_id <= ? AND keytype != 'user_signing'"
            ") AS changes ORDER BY stream_id ASC LIMIT ?",
            from_id,
            to_id,
            from_id,
            to_id,
            limit,
        )
        return [(int(r[0]), r[1], r[2], bool(r[3])) for r in rows]
