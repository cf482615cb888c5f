"""The caches stream: invalidations sent to every other process.

An invalidation is written in the same transaction as the change it describes,
so it exists exactly when the change does. Any process may write it; its
position is not kept in ``stream_positions`` (after a restart there are no
caches to invalidate). A change of a room's current state sends one batched
``cs_cache_fake`` row per chunk of members, never one row per cache key.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from synapse_lite.storage._base import (
    SQLBaseStore,
    db_to_json,
    json_encoder,
    page_of_updates,
)
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.storage.stream_ids import CACHES

if TYPE_CHECKING:
    from synapse_lite.replication.tcp.streams.data import CachesStreamRow
    from synapse_lite.server import HomeServer

logger = logging.getLogger(__name__)

#: The fake cache name for "a room's current state changed".
CURRENT_STATE_CACHE_NAME = "cs_cache_fake"
#: Members per batched current-state invalidation: a row of 50 user ids of up to
#: 255 characters stays under the replication line limit.
MEMBERS_PER_STATE_INVALIDATION = 50


class CacheInvalidationWorkerStore(SQLBaseStore):
    """Writes and applies cache invalidations."""

    def __init__(self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: HomeServer):
        super().__init__(database, db_conn, hs)
        self._cache_id_gen = self.build_id_generator(db_conn, CACHES)

    def get_cache_stream_token_for_writer(self, instance_name: str) -> int:
        return self._cache_id_gen.get_current_token_for_writer(instance_name)

    # Writing

    def send_invalidation_txn(
        self, txn: LoggingTransaction, cache_name: str, keys: list[Any] | None
    ) -> None:
        """Tell other processes to invalidate ``cache_name`` for ``keys`` (all of
        it when None) once this transaction commits. The caller invalidates its
        own process's cache itself."""
        stream_id = self._cache_id_gen.get_next_txn(txn)
        txn.execute(
            "INSERT INTO cache_invalidation_stream_by_instance"
            " (stream_id, instance_name, cache_func, keys, invalidation_ts) VALUES (?, ?, ?, ?, ?)",
            (
                stream_id,
                self._instance_name,
                cache_name,
                None if keys is None else json_encoder(keys),
                self.clock.time_msec(),
            ),
        )

    def invalidate_state_caches_and_stream_txn(
        self, txn: LoggingTransaction, room_id: str, members_changed: Iterable[str]
    ) -> None:
        """A room's current state changed: invalidate here after commit, and
        send one batched poke per chunk of changed members to the others."""
        members = sorted(set(members_changed))
        txn.call_after(self.invalidate_state_caches, room_id, members)
        if not members:
            self.send_invalidation_txn(txn, CURRENT_STATE_CACHE_NAME, [room_id])
            return
        for start in range(0, len(members), MEMBERS_PER_STATE_INVALIDATION):
            chunk = members[start : start + MEMBERS_PER_STATE_INVALIDATION]
            self.send_invalidation_txn(txn, CURRENT_STATE_CACHE_NAME, [room_id, *chunk])

    def invalidate_state_caches(self, room_id: str, members_changed: Iterable[str]) -> None:
        """Forget what this process cached about a room's current state and the
        rooms of the members whose membership changed."""
        for name in ("get_current_state_ids", "get_users_in_room", "get_room_summary"):
            self.invalidate_cache_by_name(name, [room_id])
        for user_id in members_changed:
            self.invalidate_cache_by_name("get_rooms_for_user", [user_id])
            self.invalidate_cache_by_name("get_local_memberships_with_positions", [user_id])

    # Reading (the caches stream's update function)

    async def get_all_updated_caches(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[int, list[Any]]], int, bool]:
        """Invalidations ``instance_name`` wrote after ``last_id``.

        Not bounded above by ``current_id``: invalidations are idempotent and
        the sooner they go out the better.
        """

        def txn_func(txn: LoggingTransaction) -> list[tuple[Any, ...]]:
            txn.execute(
                "SELECT stream_id, cache_func, keys, invalidation_ts"
                " FROM cache_invalidation_stream_by_instance"
                " WHERE stream_id > ? AND instance_name = ? ORDER BY stream_id ASC LIMIT ?",
                (last_id, instance_name, limit),
            )
            return txn.fetchall()

        rows = await self.db_pool.runInteraction("get_all_updated_caches", txn_func, read_only=True)
        # Rows in wire form: [cache_func, keys, invalidation_ts].
        updates = [(int(r[0]), [r[1], db_to_json(r[2]), int(r[3])]) for r in rows]
        # Not bounded above: rows past current_id are sent (and covered) too.
        return page_of_updates(updates, limit, max([current_id, *(u[0] for u in updates[-1:])]))

    # Replication

    def process_replication_rows(
        self, stream_name: str, instance_name: str, token: int, rows: Iterable[Any]
    ) -> None:
        if stream_name == "caches":
            for row in rows:
                self._apply_cache_row(row)
        super().process_replication_rows(stream_name, instance_name, token, rows)

    def _apply_cache_row(self, row: CachesStreamRow) -> None:
        if row.cache_func == CURRENT_STATE_CACHE_NAME:
            if not row.keys:
                logger.warning("Ignoring a current-state invalidation without a room")
                return
            self.invalidate_state_caches(row.keys[0], row.keys[1:])
        else:
            self.invalidate_cache_by_name(row.cache_func, row.keys)

    def process_replication_position(
        self, stream_name: str, instance_name: str, token: int
    ) -> None:
        if stream_name == "caches":
            self._cache_id_gen.advance(instance_name, token)
        super().process_replication_position(stream_name, instance_name, token)
