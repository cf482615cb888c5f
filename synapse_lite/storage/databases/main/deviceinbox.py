"""To-device messages: local inboxes and the outbox to other servers.

Both tables share the to_device stream. A message for a user on another server
is written to ``device_federation_outbox`` in the same transaction as its stream
id, so a queued message survives any restart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.storage.databases.main.client_transactions import (
    TxnKey,
    claim_client_transaction_txn,
    record_client_transaction_txn,
)
from synapse_lite.streams.catalog import ToDeviceStreamRow

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext

#: ``client_transactions.kind`` of ``PUT /sendToDevice/{eventType}/{txnId}``.
TO_DEVICE_TXN_KIND = "to_device"


class DeviceInboxWorkerStore(SQLBaseStore):
    """To-device messages: reads anywhere, writes on the to_device writer."""

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ):
        super().__init__(database, db_conn, hs)
        self._device_inbox_id_gen = hs.id_generators.of("to_device")
        self.to_device_changes = self.track_stream_changes(
            "to_device", self._device_inbox_id_gen.persisted_upto_position
        )

    def get_to_device_stream_token(self) -> int:
        return self._device_inbox_id_gen.persisted_upto_position()

    async def add_messages_to_device_inbox(
        self,
        local_messages: dict[str, dict[str, dict[str, Any]]],
        remote_messages: dict[str, dict[str, Any]],
        txn_key: TxnKey | None = None,
    ) -> tuple[int, bool]:
        """Queue messages in one transaction under one stream id.

        ``local_messages``: user_id -> device_id -> message (device ``*`` is
        expanded by the caller). ``remote_messages``: destination -> the EDU
        content to send there. ``txn_key``: the client's ``(user_id,
        device_id, txn_id)``, recorded in ``client_transactions`` in this same
        transaction; if it is there already the messages were sent before
        (a retry, maybe after a restart, maybe of this very transaction after
        a COMMIT whose outcome was unknown) and nothing is written.

        Returns ``(stream id, True)`` for a new write, ``(the first write's
        stream id, False)`` for a repeat.
        """

        def txn_func(txn: LoggingTransaction) -> tuple[int, bool]:
            if txn_key is not None:
                first = claim_client_transaction_txn(
                    txn, txn_key, TO_DEVICE_TXN_KIND, self.clock.time_msec()
                )
                if first is not None:
                    return first, False
            stream_id = self._device_inbox_id_gen.get_next_txn(txn)
            for user_id in local_messages:
                self.to_device_changes.record_after_commit(txn, user_id, stream_id)
            if txn_key is not None:
                record_client_transaction_txn(txn, txn_key, TO_DEVICE_TXN_KIND, stream_id)
            rows = [
                (user_id, device_id, stream_id, json_encoder(message), self._instance_name)
                for user_id, devices in local_messages.items()
                for device_id, message in devices.items()
            ]
            txn.execute_batch(
                "INSERT INTO device_inbox (user_id, device_id, stream_id, message_json,"
                " instance_name) VALUES (?, ?, ?, ?, ?)",
                rows,
            )
            now = self.clock.time_msec()
            txn.execute_batch(
                "INSERT INTO device_federation_outbox (destination, stream_id, queued_ts,"
                " messages_json, instance_name) VALUES (?, ?, ?, ?, ?)",
                [
                    (destination, stream_id, now, json_encoder(edu), self._instance_name)
                    for destination, edu in remote_messages.items()
                ],
            )
            return stream_id, True

        # Keyed by the client's transaction id, running it again after a
        # COMMIT of unknown outcome writes nothing twice; without one it may.
        return await self.db_pool.runInteraction(
            "add_messages_to_device_inbox", txn_func, idempotent=txn_key is not None
        )

    async def add_remote_messages_to_device_inbox(
        self,
        origin: str,
        message_id: str,
        local_messages: dict[str, dict[str, dict[str, Any]]],
    ) -> int | None:
        """Deliver a to-device EDU from another server, once per
        ``(origin, message_id)``: the id is recorded in the transaction that
        stores the messages, so a replay (even in another federation
        transaction, or after a crash) delivers nothing. Returns the stream id,
        or None when it was a replay or had no local recipient."""

        def txn_func(txn: LoggingTransaction) -> int | None:
            txn.execute(
                "INSERT INTO device_federation_inbox (origin, message_id, received_ts)"
                " VALUES (?, ?, ?) ON CONFLICT (origin, message_id) DO NOTHING",
                (origin, message_id, self.clock.time_msec()),
            )
            if txn.rowcount == 0:
                return None
            rows = [
                (user_id, device_id, json_encoder(message))
                for user_id, devices in local_messages.items()
                for device_id, message in devices.items()
            ]
            if not rows:
                return None
            stream_id = self._device_inbox_id_gen.get_next_txn(txn)
            for user_id in local_messages:
                self.to_device_changes.record_after_commit(txn, user_id, stream_id)
            txn.execute_batch(
                "INSERT INTO device_inbox (user_id, device_id, stream_id, message_json,"
                " instance_name) VALUES (?, ?, ?, ?, ?)",
                [(u, d, stream_id, m, self._instance_name) for u, d, m in rows],
            )
            return stream_id

        return await self.db_pool.runInteraction(
            "add_remote_messages_to_device_inbox", txn_func, idempotent=True
        )

    async def get_messages_for_device(
        self, user_id: str, device_id: str, from_id: int, to_id: int, limit: int
    ) -> tuple[list[dict[str, Any]], int]:
        """Messages for a device in ``(from_id, to_id]``, oldest first, and the
        stream id up to which they were read (``to_id`` unless limited)."""
        rows = await self.db_pool.select(
            "get_messages_for_device",
            "SELECT stream_id, message_json FROM device_inbox"
            " WHERE user_id = ? AND device_id = ? AND stream_id > ? AND stream_id <= ?"
            " ORDER BY stream_id ASC LIMIT ?",
            user_id,
            device_id,
            from_id,
            to_id,
            limit,
        )
        messages = [db_to_json(r[1]) for r in rows]
        upto = int(rows[-1][0]) if len(rows) >= limit else to_id
        return messages, upto

    async def get_device_messages_between(
        self, from_id: int, to_id: int, limit: int
    ) -> list[tuple[int, str, str, dict[str, Any]]]:
        """Every local device's messages in ``(from_id, to_id]``, oldest
        first, at most ``limit``: ``(stream id, user, device, message)``."""
        rows = await self.db_pool.select(
            "get_device_messages_between",
            "SELECT stream_id, user_id, device_id, message_json FROM device_inbox"
            " WHERE stream_id > ? AND stream_id <= ? ORDER BY stream_id ASC LIMIT ?",
            from_id,
            to_id,
            limit,
        )
        return [(int(r[0]), r[1], r[2], db_to_json(r[3])) for r in rows]

    async def delete_messages_for_device(self, user_id: str, device_id: str, up_to_id: int) -> int:
        """Delete delivered messages (the client has acknowledged ``up_to_id``)."""

        def txn_func(txn: LoggingTransaction) -> int:
            txn.execute(
                "DELETE FROM device_inbox WHERE user_id = ? AND device_id = ? AND stream_id <= ?",
                (user_id, device_id, up_to_id),
            )
            return txn.rowcount

        return await self.db_pool.runInteraction(
            "delete_messages_for_device", txn_func, idempotent=True
        )

    async def get_all_new_device_messages(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[int, ToDeviceStreamRow]], int, bool]:
        """The to_device stream's update function: one row per local user or
        destination server with new messages.

        One message to many users shares one stream id, so a page always ends
        with every row of its last id.
        """
        sql = (
            "SELECT stream_id, entity FROM ("
            " SELECT stream_id, user_id AS entity FROM device_inbox"
            "  WHERE ? < stream_id AND stream_id <= ? AND instance_name = ?"
            " UNION"
            " SELECT stream_id, destination AS entity FROM device_federation_outbox"
            "  WHERE ? < stream_id AND stream_id <= ? AND instance_name = ?"
            ") AS changes ORDER BY stream_id ASC"
        )

        def updates(rows: list[tuple[Any, ...]]) -> list[tuple[int, ToDeviceStreamRow]]:
            return [(int(r[0]), ToDeviceStreamRow(entity=r[1])) for r in rows]

        def txn_func(
            txn: LoggingTransaction,
        ) -> tuple[list[tuple[int, ToDeviceStreamRow]], int, bool]:
            args = (last_id, current_id, instance_name) * 2
            txn.execute(sql + " LIMIT ?", (*args, limit))
            rows = txn.fetchall()
            if len(rows) < limit:
                return updates(rows), current_id, False
            upto = int(rows[-1][0])
            txn.execute(sql, (last_id, upto, instance_name) * 2)
            return updates(txn.fetchall()), upto, True

        return await self.db_pool.runInteraction(
            "get_all_new_device_messages", txn_func, read_only=True
        )
