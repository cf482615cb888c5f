"""``server_notice_rooms``: each user's server notices room (any process
writes it; the admin API's ``send_server_notice``)."""

from __future__ import annotations

from synapse_lite.storage._base import SQLBaseStore


class ServerNoticesWorkerStore(SQLBaseStore):
    async def get_server_notice_room(self, user_id: str) -> str | None:
        rows = await self.db_pool.select(
            "get_server_notice_room",
            "SELECT room_id FROM server_notice_rooms WHERE user_id = ?",
            user_id,
        )
        return str(rows[0][0]) if rows else None

    async def set_server_notice_room(self, user_id: str, room_id: str) -> None:
        await self.db_pool.execute(
            "set_server_notice_room",
            "INSERT INTO server_notice_rooms (user_id, room_id) VALUES (?, ?)"
            " ON CONFLICT (user_id) DO UPDATE SET room_id = EXCLUDED.room_id",
            user_id,
            room_id,
        )
