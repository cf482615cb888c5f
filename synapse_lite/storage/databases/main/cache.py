"""The caches stream: invalidations sent to every other process.

An invalidation is written in the same transaction as the change it describes,
so it exists exactly when the change does. Any process may write it; its
position is not kept in ``stream_positions`` (after a restart there are no
caches to invalidate).

A change of a room's current state sends nothing here: the events stream,
which every process follows, already carries it (the state row and the
event's row), and receivers forget a room's state caches once per batch of
those rows, before the position advances and /sync is woken
(``EventsWorkerStore.invalidate_for_events_rows``).
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
from synapse_lite.streams.catalog import CachesStreamRow

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext

logger = logging.getLogger(__name__)


class CacheInvalidationWorkerStore(SQLBaseStore):
    """Writes and applies cache invalidations."""

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ):
        super().__init__(database, db_conn, hs)
        self._cache_id_gen = hs.id_generators.of("caches")

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

    def invalidate_state_caches(self, room_id: str, members_changed: Iterable[str]) -> None:
        """Forget what this process cached about a room's current state and the
        rooms of the members whose membership changed."""
        for name in (
            "get_current_state_ids",
            "get_history_visibility_settings",
            "get_users_in_room",
            "get_room_summary",
            "get_push_room_members",
        ):
            self.invalidate_cache_by_name(name, [room_id])
        for user_id in members_changed:
            self.invalidate_cache_by_name("get_rooms_for_user", [user_id])
            self.invalidate_cache_by_name("get_local_memberships_with_positions", [user_id])

    # Reading (the caches stream's update function)

    async def get_all_updated_caches(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[int, CachesStreamRow]], int, bool]:
        """Invalidations ``instance_name`` wrote after ``last_id``, up to
        ``current_id``: the writer's position, below which every id has finished.

        Bounded like every stream: a row above the position may be followed by
        a lower id that has not committed yet (PostgreSQL commits one process's
        transactions out of order), and a follower that took the row's id as
        its new position would skip that invalidation.
        """

        def txn_func(txn: LoggingTransaction) -> list[tuple[Any, ...]]:
            txn.execute(
                "SELECT stream_id, cache_func, keys, invalidation_ts"
                " FROM cache_invalidation_stream_by_instance"
                " WHERE ? < stream_id AND stream_id <= ? AND instance_name = ?"
                " ORDER BY stream_id ASC LIMIT ?",
                (last_id, current_id, instance_name, limit),
            )
            return txn.fetchall()

        rows = await self.db_pool.runInteraction("get_all_updated_caches", txn_func, read_only=True)
        updates = [
            (
                int(r[0]),
                CachesStreamRow(cache_func=r[1], keys=db_to_json(r[2]), invalidation_ts=int(r[3])),
            )
            for r in rows
        ]
        return page_of_updates(updates, limit, current_id)

    # Receiving (the caches stream's invalidation)

    def apply_cache_invalidations(self, rows: Iterable[CachesStreamRow]) -> None:
        """Invalidations another process wrote."""
        for row in rows:
            self.invalidate_cache_by_name(row.cache_func, row.keys)
