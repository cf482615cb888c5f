"""Federation tables: remote servers' keys, received transactions, delivery
state per destination, and reading/deleting the to-device outbox.

Any process may read and write these (no stream): the federation sender owns
``destinations`` and the outbox deletions, whichever process serves the
``federation`` resource records received transactions and fetched keys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext


@attr.s(slots=True, frozen=True, auto_attribs=True)
class OutboxRow:
    """One queued EDU for a destination, at its to_device stream id."""

    stream_id: int
    content: dict[str, Any]


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RetryState:
    """Backoff towards a destination. ``retry_interval_ms`` 0: it is up.
    ``failure_ts``: when the current run of failures began (None: up)."""

    retry_last_ts: int = 0
    retry_interval_ms: int = 0
    failure_ts: int | None = None


class FederationWorkerStore(SQLBaseStore):
    """The federation tables (see the module docstring)."""

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ):
        super().__init__(database, db_conn, hs)

    # Remote servers' keys

    async def get_server_keys(self, server_name: str) -> dict[str, tuple[str, int]]:
        """``key_id -> (verify_key, valid_until_ts)`` cached for a server."""
        rows = await self.db_pool.select(
            "get_server_keys",
            "SELECT key_id, verify_key, valid_until_ts FROM server_keys WHERE server_name = ?",
            server_name,
        )
        return {r[0]: (r[1], int(r[2])) for r in rows}

    async def store_server_keys(
        self,
        server_name: str,
        keys: dict[str, tuple[str, int]],
        document: dict[str, Any] | None = None,
        document_valid_until_ts: int = 0,
    ) -> None:
        """Cache ``key_id -> (verify_key, valid_until_ts)`` of a server and,
        with ``document``, its key document as signed (unless the one kept
        is valid for longer), in one transaction."""
        now = self.clock.time_msec()

        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute_batch(
                "INSERT INTO server_keys (server_name, key_id, verify_key, valid_until_ts,"
                " fetched_ts) VALUES (?, ?, ?, ?, ?) ON CONFLICT (server_name, key_id)"
                " DO UPDATE SET verify_key = EXCLUDED.verify_key,"
                " valid_until_ts = EXCLUDED.valid_until_ts, fetched_ts = EXCLUDED.fetched_ts",
                [(server_name, k, v, until, now) for k, (v, until) in keys.items()],
            )
            if document is not None:
                txn.execute(
                    "INSERT INTO server_key_json (server_name, key_json, valid_until_ts,"
                    " fetched_ts) VALUES (?, ?, ?, ?) ON CONFLICT (server_name) DO UPDATE"
                    " SET key_json = EXCLUDED.key_json,"
                    " valid_until_ts = EXCLUDED.valid_until_ts,"
                    " fetched_ts = EXCLUDED.fetched_ts"
                    " WHERE server_key_json.valid_until_ts <= EXCLUDED.valid_until_ts",
                    (server_name, json_encoder(document), document_valid_until_ts, now),
                )

        await self.db_pool.runInteraction("store_server_keys", txn_func)

    async def get_server_key_json(self, server_name: str) -> dict[str, Any] | None:
        """The newest key document of ``server_name`` we hold, as it signed it."""
        rows = await self.db_pool.select(
            "get_server_key_json",
            "SELECT key_json FROM server_key_json WHERE server_name = ?",
            server_name,
        )
        return db_to_json(rows[0][0]) if rows else None

    # Received transactions

    async def get_received_transaction(self, origin: str, txn_id: str) -> dict[str, Any] | None:
        """The response we gave to ``origin``'s transaction ``txn_id``, if any."""
        rows = await self.db_pool.select(
            "get_received_transaction",
            "SELECT response_json FROM received_transactions"
            " WHERE origin = ? AND transaction_id = ?",
            origin,
            txn_id,
        )
        return db_to_json(rows[0][0]) if rows else None

    async def store_received_transaction(
        self, origin: str, txn_id: str, response: dict[str, Any]
    ) -> None:
        await self.db_pool.execute(
            "store_received_transaction",
            "INSERT INTO received_transactions (origin, transaction_id, response_json,"
            " received_ts) VALUES (?, ?, ?, ?) ON CONFLICT (origin, transaction_id) DO NOTHING",
            origin,
            txn_id,
            json_encoder(response),
            self.clock.time_msec(),
        )

    # Destinations

    async def get_retry_state(self, destination: str) -> RetryState:
        rows = await self.db_pool.select(
            "get_retry_state",
            "SELECT retry_last_ts, retry_interval, failure_ts FROM destinations"
            " WHERE destination = ?",
            destination,
        )
        if not rows:
            return RetryState()
        last, interval, failure = rows[0]
        return RetryState(int(last), int(interval), None if failure is None else int(failure))

    async def set_retry_state(self, destination: str, state: RetryState) -> None:
        await self.db_pool.execute(
            "set_retry_state",
            "INSERT INTO destinations (destination, retry_last_ts, retry_interval, failure_ts)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (destination) DO UPDATE SET"
            " retry_last_ts = EXCLUDED.retry_last_ts, retry_interval = EXCLUDED.retry_interval,"
            " failure_ts = EXCLUDED.failure_ts",
            destination,
            state.retry_last_ts,
            state.retry_interval_ms,
            state.failure_ts,
        )

    async def get_destination_names(self) -> list[str]:
        """Every destination we have recorded anything about."""
        rows = await self.db_pool.select(
            "get_destination_names", "SELECT destination FROM destinations"
        )
        return [r[0] for r in rows]

    # The to-device outbox

    async def get_destinations_with_pending_edus(self) -> dict[str, int]:
        """Every destination with queued EDUs, and the largest stream id queued."""
        rows = await self.db_pool.select(
            "get_destinations_with_pending_edus",
            "SELECT destination, MAX(stream_id) FROM device_federation_outbox GROUP BY destination",
        )
        return {r[0]: int(r[1]) for r in rows}

    async def get_pending_edus(
        self, destination: str, upto_stream_id: int, limit: int
    ) -> list[OutboxRow]:
        """Queued EDUs for ``destination`` at or below ``upto_stream_id``, oldest first."""
        rows = await self.db_pool.select(
            "get_pending_edus",
            "SELECT stream_id, messages_json FROM device_federation_outbox"
            " WHERE destination = ? AND stream_id <= ? ORDER BY stream_id ASC LIMIT ?",
            destination,
            upto_stream_id,
            limit,
        )
        return [OutboxRow(int(r[0]), db_to_json(r[1])) for r in rows]

    async def delete_sent_edus(self, destination: str, stream_ids: list[int]) -> None:
        """The destination accepted these: forget them and note how far we got."""

        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute_batch(
                "DELETE FROM device_federation_outbox WHERE destination = ? AND stream_id = ?",
                [(destination, s) for s in stream_ids],
            )
            txn.execute(
                "INSERT INTO destinations (destination, last_sent_stream_id) VALUES (?, ?)"
                " ON CONFLICT (destination) DO UPDATE SET last_sent_stream_id ="
                " CASE WHEN destinations.last_sent_stream_id > EXCLUDED.last_sent_stream_id"
                " THEN destinations.last_sent_stream_id ELSE EXCLUDED.last_sent_stream_id END",
                (destination, max(stream_ids)),
            )

        await self.db_pool.runInteraction("delete_sent_edus", txn_func)
