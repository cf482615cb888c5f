"""Rooms and their current state."""

from __future__ import annotations

from typing import Any

from synapse_lite.storage.caches import cached
from synapse_lite.storage.databases.main.roommember import RoomMemberWorkerStore


class RoomWorkerStore(RoomMemberWorkerStore):
    """Room records and current state reads."""

    async def get_room(self, room_id: str) -> dict[str, Any] | None:
        rows = await self.db_pool.select(
            "get_room",
            "SELECT room_id, creator, is_public, room_version, creation_ts FROM rooms"
            " WHERE room_id = ?",
            room_id,
        )
        if not rows:
            return None
        r = rows[0]
        return {
            "room_id": r[0],
            "creator": r[1],
            "is_public": bool(r[2]),
            "room_version": r[3],
            "creation_ts": int(r[4]),
        }

    @cached()
    async def get_current_state_ids(self, room_id: str) -> dict[tuple[str, str], str]:
        """The room's current state: (type, state_key) -> event_id."""
        rows = await self.db_pool.select(
            "get_current_state_ids",
            "SELECT type, state_key, event_id FROM current_state_events WHERE room_id = ?",
            room_id,
        )
        return {(r[0], r[1]): r[2] for r in rows}
