"""Sync filters uploaded by clients."""

from __future__ import annotations

from typing import Any

from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder
from synapse_lite.storage.database import LoggingTransaction


class FilteringWorkerStore(SQLBaseStore):
    """Filters, numbered per user."""

    async def add_user_filter(self, user_id: str, filter_json: dict[str, Any]) -> int:
        def txn_func(txn: LoggingTransaction) -> int:
            encoded = json_encoder(filter_json)
            # Two processes may number a filter at once: the loser of the
            # conflict takes the next number.
            while True:
                txn.execute("SELECT MAX(filter_id) FROM user_filters WHERE user_id = ?", (user_id,))
                row = txn.fetchone()
                filter_id = (int(row[0]) + 1) if row and row[0] is not None else 0
                txn.execute(
                    "INSERT INTO user_filters (user_id, filter_id, filter_json) VALUES (?, ?, ?)"
                    " ON CONFLICT (user_id, filter_id) DO NOTHING",
                    (user_id, filter_id, encoded),
                )
                if txn.rowcount == 1:
                    return filter_id

        return await self.db_pool.runInteraction("add_user_filter", txn_func)

    async def get_user_filter(self, user_id: str, filter_id: int) -> dict[str, Any] | None:
        rows = await self.db_pool.select(
            "get_user_filter",
            "SELECT filter_json FROM user_filters WHERE user_id = ? AND filter_id = ?",
            user_id,
            filter_id,
        )
        return db_to_json(rows[0][0]) if rows else None
