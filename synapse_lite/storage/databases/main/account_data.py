"""Account data: global, per room, and room tags, on one stream.

The three tables draw ids from one sequence (``account_data_sequence``), so an
id is unique across them and over restarts, and the stream's updates are read
in stream-id order alone (the seed notes' account-data bug came from two ids
being equal across tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder, page_of_updates
from synapse_lite.storage.caches import cached
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.streams.catalog import AccountDataStreamRow

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext

#: The account data type under which tag changes appear on the stream.
TAG_DATA_TYPE = "m.tag"


class AccountDataWorkerStore(SQLBaseStore):
    """Account data and tags: reads anywhere, writes on the account_data writer."""

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ):
        super().__init__(database, db_conn, hs)
        self._account_data_id_gen = hs.id_generators.of("account_data")
        self.account_data_changes = self.track_stream_changes(
            "account_data", self._account_data_id_gen.persisted_upto_position
        )

    # Writes

    async def add_account_data_for_user(
        self, user_id: str, data_type: str, content: dict[str, Any]
    ) -> int:
        """Set a global account data entry; returns its stream id."""

        def txn_func(txn: LoggingTransaction) -> int:
            stream_id = self._account_data_id_gen.get_next_txn(txn)
            self.account_data_changes.record_after_commit(txn, user_id, stream_id)
            txn.execute(
                "INSERT INTO account_data (user_id, account_data_type, stream_id, content,"
                " instance_name) VALUES (?, ?, ?, ?, ?)"
                " ON CONFLICT (user_id, account_data_type) DO UPDATE SET"
                " stream_id = EXCLUDED.stream_id, content = EXCLUDED.content,"
                " instance_name = EXCLUDED.instance_name",
                (user_id, data_type, stream_id, json_encoder(content), self._instance_name),
            )
            return stream_id

        # An upsert of one row per key: a second run stores the same value.
        try:
            return await self.db_pool.runInteraction(
                "add_account_data_for_user", txn_func, idempotent=True
            )
        finally:
            # The writer reads its own write at once; the other processes
            # forget it when its stream row comes (invalidate_for_account_data_rows).
            self.get_global_account_data_of_type.invalidate((user_id, data_type))

    async def add_account_data_to_room(
        self, user_id: str, room_id: str, data_type: str, content: dict[str, Any]
    ) -> int:
        """Set a per-room account data entry; returns its stream id."""

        def txn_func(txn: LoggingTransaction) -> int:
            stream_id = self._account_data_id_gen.get_next_txn(txn)
            self.account_data_changes.record_after_commit(txn, user_id, stream_id)
            txn.execute(
                "INSERT INTO room_account_data (user_id, room_id, account_data_type, stream_id,"
                " content, instance_name) VALUES (?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (user_id, room_id, account_data_type) DO UPDATE SET"
                " stream_id = EXCLUDED.stream_id, content = EXCLUDED.content,"
                " instance_name = EXCLUDED.instance_name",
                (
                    user_id,
                    room_id,
                    data_type,
                    stream_id,
                    json_encoder(content),
                    self._instance_name,
                ),
            )
            return stream_id

        return await self.db_pool.runInteraction(
            "add_account_data_to_room", txn_func, idempotent=True
        )

    async def set_room_tag(
        self, user_id: str, room_id: str, tag: str, content: dict[str, Any] | None
    ) -> int:
        """Add (``content``) or remove (None) one tag of a room; returns the
        stream id of the change, which appears on the stream as ``m.tag``."""

        def txn_func(txn: LoggingTransaction) -> int:
            stream_id = self._account_data_id_gen.get_next_txn(txn)
            self.account_data_changes.record_after_commit(txn, user_id, stream_id)
            if content is None:
                txn.execute(
                    "DELETE FROM room_tags WHERE user_id = ? AND room_id = ? AND tag = ?",
                    (user_id, room_id, tag),
                )
            else:
                txn.execute(
                    "INSERT INTO room_tags (user_id, room_id, tag, content) VALUES (?, ?, ?, ?)"
                    " ON CONFLICT (user_id, room_id, tag) DO UPDATE SET"
                    " content = EXCLUDED.content",
                    (user_id, room_id, tag, json_encoder(content)),
                )
            txn.execute(
                "INSERT INTO room_tags_revisions (user_id, room_id, stream_id, instance_name)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (user_id, room_id) DO UPDATE SET"
                " stream_id = EXCLUDED.stream_id, instance_name = EXCLUDED.instance_name",
                (user_id, room_id, stream_id, self._instance_name),
            )
            return stream_id

        return await self.db_pool.runInteraction("set_room_tag", txn_func)

    # Reads

    async def get_tags_for_room(self, user_id: str, room_id: str) -> dict[str, dict[str, Any]]:
        """tag -> content, of one user's room."""
        rows = await self.db_pool.select(
            "get_tags_for_room",
            "SELECT tag, content FROM room_tags WHERE user_id = ? AND room_id = ?",
            user_id,
            room_id,
        )
        return {tag: db_to_json(content) for tag, content in rows}

    async def get_global_account_data(self, user_id: str) -> dict[str, dict[str, Any]]:
        rows = await self.db_pool.select(
            "get_global_account_data",
            "SELECT account_data_type, content FROM account_data WHERE user_id = ?",
            user_id,
        )
        return {r[0]: db_to_json(r[1]) for r in rows}

    @cached()
    async def get_global_account_data_of_type(
        self, user_id: str, data_type: str
    ) -> dict[str, Any] | None:
        """One global account data entry of a user, or None (treat as
        read-only: cached per process, as every sync reads the ignored users
        and sliding sync ``m.direct``; forgotten on the account data stream's
        row, before its position advances)."""
        rows = await self.db_pool.select(
            "get_global_account_data_of_type",
            "SELECT content FROM account_data WHERE user_id = ? AND account_data_type = ?",
            user_id,
            data_type,
        )
        return db_to_json(rows[0][0]) if rows else None

    def invalidate_for_account_data_rows(self, rows: Sequence[AccountDataStreamRow]) -> None:
        """Forget the cached global entries the stream's ``rows`` changed."""
        for row in rows:
            if row.room_id is None:
                self.get_global_account_data_of_type.invalidate((row.user_id, row.data_type))

    async def get_room_account_data(self, user_id: str) -> dict[str, dict[str, dict[str, Any]]]:
        """room_id -> type -> content."""
        rows = await self.db_pool.select(
            "get_room_account_data",
            "SELECT room_id, account_data_type, content FROM room_account_data WHERE user_id = ?",
            user_id,
        )
        result: dict[str, dict[str, dict[str, Any]]] = {}
        for room_id, data_type, content in rows:
            result.setdefault(room_id, {})[data_type] = db_to_json(content)
        return result

    async def get_tags_for_user(self, user_id: str) -> dict[str, dict[str, dict[str, Any]]]:
        """room_id -> tag -> content."""
        rows = await self.db_pool.select(
            "get_tags_for_user",
            "SELECT room_id, tag, content FROM room_tags WHERE user_id = ?",
            user_id,
        )
        result: dict[str, dict[str, dict[str, Any]]] = {}
        for room_id, tag, content in rows:
            result.setdefault(room_id, {})[tag] = db_to_json(content)
        return result

    async def get_account_data_changes(
        self, user_id: str, from_id: int, to_id: int
    ) -> list[tuple[int, str | None, str]]:
        """What changed for one user in ``(from_id, to_id]``:
        ``(stream_id, room_id or None, data_type)``, in stream order."""
        return [
            (stream_id, room_id, data_type)
            for stream_id, (uid, room_id, data_type) in await self._account_data_rows(
                from_id, to_id, None, user_id
            )
            if uid == user_id
        ]

    # The stream's update function

    async def get_account_data_stream_updates(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[int, AccountDataStreamRow]], int, bool]:
        """The account_data stream's update function: changes in ``(last_id,
        current_id]``, ordered by stream id alone (the stream has one writer)."""
        rows = await self._account_data_rows(last_id, current_id, limit, None)
        updates = [
            (stream_id, AccountDataStreamRow(user_id=u, room_id=r, data_type=t))
            for stream_id, (u, r, t) in rows
        ]
        return page_of_updates(updates, limit, current_id)

    async def _account_data_rows(
        self, last_id: int, current_id: int, limit: int | None, user_id: str | None
    ) -> list[tuple[int, tuple[str, str | None, str]]]:
        user_clause = " AND user_id = ?" if user_id else ""
        user_args = [user_id] if user_id else []
        sql = (
            "SELECT stream_id, user_id, room_id, data_type FROM ("
            " SELECT stream_id, user_id, NULL AS room_id, account_data_type AS data_type"
            f"  FROM account_data WHERE ? < stream_id AND stream_id <= ?{user_clause}"
            " UNION ALL"
            " SELECT stream_id, user_id, room_id, account_data_type AS data_type"
            f"  FROM room_account_data WHERE ? < stream_id AND stream_id <= ?{user_clause}"
            " UNION ALL"
            f" SELECT stream_id, user_id, room_id, '{TAG_DATA_TYPE}' AS data_type"
            f"  FROM room_tags_revisions WHERE ? < stream_id AND stream_id <= ?{user_clause}"
            ") AS changes ORDER BY stream_id ASC"
        )
        args: list[Any] = []
        for _ in range(3):
            args.extend([last_id, current_id, *user_args])
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)
        rows = await self.db_pool.select("get_updated_account_data", sql, *args)
        return [(int(r[0]), (r[1], r[2], r[3])) for r in rows]
