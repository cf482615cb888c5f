"""Presence: each user's latest state, at the presence stream id that set it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.storage._base import SQLBaseStore, page_of_updates
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
)
from synapse_lite.streams.catalog import PresenceStreamRow

if TYPE_CHECKING:
    from synapse_lite.storage._base import StoreContext


@attr.s(slots=True, frozen=True, auto_attribs=True)
class UserPresenceState:
    """A user's presence, as stored and as replicated (field order = wire order)."""

    user_id: str
    state: str
    last_active_ts: int = 0
    last_federation_update_ts: int = 0
    last_user_sync_ts: int = 0
    status_msg: str | None = None
    currently_active: bool = False

    @classmethod
    def default(cls, user_id: str) -> UserPresenceState:
        return cls(user_id=user_id, state="offline")

    def to_client_content(self, now_ms: int) -> dict[str, Any]:
        content: dict[str, Any] = {
            "presence": self.state,
            "currently_active": self.currently_active,
        }
        if self.last_active_ts:
            content["last_active_ago"] = max(0, now_ms - self.last_active_ts)
        if self.status_msg is not None:
            content["status_msg"] = self.status_msg
        return content


_COLUMNS = (
    "user_id, state, last_active_ts, last_federation_update_ts, last_user_sync_ts,"
    " status_msg, currently_active"
)


def _state_from_row(row: tuple[Any, ...]) -> UserPresenceState:
    return UserPresenceState(
        user_id=row[0],
        state=row[1],
        last_active_ts=int(row[2]),
        last_federation_update_ts=int(row[3]),
        last_user_sync_ts=int(row[4]),
        status_msg=row[5],
        currently_active=bool(row[6]),
    )


class PresenceWorkerStore(SQLBaseStore):
    """Presence: reads anywhere, writes on the presence writer."""

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ):
        super().__init__(database, db_conn, hs)
        self._presence_id_gen = hs.id_generators.of("presence")
        self.presence_changes = self.track_stream_changes(
            "presence", self._presence_id_gen.persisted_upto_position
        )

    async def update_presence(self, states: list[UserPresenceState]) -> int:
        """Store new states (one stream id each); returns the last stream id."""

        def txn_func(txn: LoggingTransaction) -> int:
            stream_ids = self._presence_id_gen.get_next_mult_txn(txn, len(states))
            for stream_id, state in zip(stream_ids, states, strict=True):
                self.presence_changes.record_after_commit(txn, state.user_id, stream_id)
                txn.execute(
                    "INSERT INTO presence_stream (stream_id, user_id, state, last_active_ts,"
                    " last_federation_update_ts, last_user_sync_ts, status_msg, currently_active,"
                    " instance_name) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (user_id) DO UPDATE SET stream_id = EXCLUDED.stream_id,"
                    " state = EXCLUDED.state, last_active_ts = EXCLUDED.last_active_ts,"
                    " last_federation_update_ts = EXCLUDED.last_federation_update_ts,"
                    " last_user_sync_ts = EXCLUDED.last_user_sync_ts,"
                    " status_msg = EXCLUDED.status_msg,"
                    " currently_active = EXCLUDED.currently_active,"
                    " instance_name = EXCLUDED.instance_name",
                    (
                        stream_id,
                        state.user_id,
                        state.state,
                        state.last_active_ts,
                        state.last_federation_update_ts,
                        state.last_user_sync_ts,
                        state.status_msg,
                        state.currently_active,
                        self._instance_name,
                    ),
                )
            return stream_ids[-1]

        return await self.db_pool.runInteraction("update_presence", txn_func)

    async def get_presence_for_users(self, user_ids: list[str]) -> dict[str, UserPresenceState]:
        if not user_ids:
            return {}
        placeholders = ", ".join("?" for _ in user_ids)
        rows = await self.db_pool.select(
            "get_presence_for_users",
            f"SELECT {_COLUMNS} FROM presence_stream WHERE user_id IN ({placeholders})",
            *user_ids,
        )
        return {r[0]: _state_from_row(r) for r in rows}

    async def get_presence_changes(
        self, user_ids: list[str], from_id: int, to_id: int
    ) -> list[UserPresenceState]:
        """Latest states of ``user_ids`` that changed in ``(from_id, to_id]``."""
        if not user_ids:
            return []
        placeholders = ", ".join("?" for _ in user_ids)
        rows = await self.db_pool.select(
            "get_presence_changes",
            f"SELECT {_COLUMNS} FROM presence_stream WHERE user_id IN ({placeholders})"
            " AND stream_id > ? AND stream_id <= ?",
            *user_ids,
            from_id,
            to_id,
        )
        return [_state_from_row(r) for r in rows]

    def get_presence_position(self) -> int:
        """Where every presence change up to is stored (this process's view)."""
        return self._presence_id_gen.persisted_upto_position()

    async def get_presence_between(
        self, from_id: int, to_id: int, limit: int
    ) -> list[tuple[int, UserPresenceState]]:
        """Users whose latest presence was set in ``(from_id, to_id]``, in
        stream order, at most ``limit`` (an earlier change of a user set
        again since is not seen: only the latest counts)."""
        rows = await self.db_pool.select(
            "get_presence_between",
            f"SELECT stream_id, {_COLUMNS} FROM presence_stream"
            " WHERE ? < stream_id AND stream_id <= ? ORDER BY stream_id ASC LIMIT ?",
            from_id,
            to_id,
            limit,
        )
        return [(int(r[0]), _state_from_row(r[1:])) for r in rows]

    async def get_all_presence_updates(
        self, instance_name: str, last_id: int, current_id: int, limit: int
    ) -> tuple[list[tuple[int, PresenceStreamRow]], int, bool]:
        """The presence stream's update function."""
        rows = await self.db_pool.select(
            "get_all_presence_updates",
            f"SELECT stream_id, {_COLUMNS} FROM presence_stream"
            " WHERE ? < stream_id AND stream_id <= ? AND instance_name = ?"
            " ORDER BY stream_id ASC LIMIT ?",
            last_id,
            current_id,
            instance_name,
            limit,
        )
        updates = [
            (int(r[0]), PresenceStreamRow(**attr.asdict(_state_from_row(r[1:])))) for r in rows
        ]
        return page_of_updates(updates, limit, current_id)
