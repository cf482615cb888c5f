"""Room membership: who is in which room, now and when it changed."""

from __future__ import annotations

from synapse_lite.storage.caches import cached
from synapse_lite.storage.databases.main.stream import StreamWorkerStore


class RoomMemberWorkerStore(StreamWorkerStore):
    """Membership reads. Writes happen with the events that change membership
    (see ``events.py``)."""

    @cached()
    async def get_rooms_for_user(self, user_id: str) -> frozenset[str]:
        """Rooms a local user is joined to now."""
        rows = await self.db_pool.select(
            "get_rooms_for_user",
            "SELECT room_id FROM local_current_membership"
            " WHERE user_id = ? AND membership = 'join'",
            user_id,
        )
        return frozenset(r[0] for r in rows)

    @cached()
    async def get_users_in_room(self, room_id: str) -> frozenset[str]:
        """Users joined to a room now."""
        rows = await self.db_pool.select(
            "get_users_in_room",
            "SELECT state_key FROM current_state_events"
            " WHERE room_id = ? AND type = 'm.room.member' AND membership = 'join'",
            room_id,
        )
        return frozenset(r[0] for r in rows)

    async def get_local_memberships(self, user_id: str) -> dict[str, tuple[str, str, int]]:
        """Every room a local user has a membership in: room_id -> (membership,
        event_id, stream_ordering)."""
        rows = await self.db_pool.select(
            "get_local_memberships",
            "SELECT room_id, membership, event_id, event_stream_ordering"
            " FROM local_current_membership WHERE user_id = ?",
            user_id,
        )
        return {r[0]: (r[1], r[2], int(r[3])) for r in rows}

    async def get_membership_in_room(self, user_id: str, room_id: str) -> tuple[str, str] | None:
        """A user's current membership of a room and the event that set it."""
        rows = await self.db_pool.select(
            "get_membership_in_room",
            "SELECT membership, event_id FROM current_state_events"
            " WHERE room_id = ? AND type = 'm.room.member' AND state_key = ?",
            room_id,
            user_id,
        )
        return (rows[0][0], rows[0][1]) if rows else None

    async def get_membership_changes_for_user(
        self, user_id: str, from_stream: int, to_stream: int
    ) -> list[tuple[str, str, str, int]]:
        """Membership events for a user with stream ids in ``(from, to]``:
        ``(room_id, membership, event_id, stream_ordering)``, oldest first."""
        rows = await self.db_pool.select(
            "get_membership_changes_for_user",
            "SELECT room_id, membership, event_id, stream_ordering FROM room_memberships"
            " WHERE user_id = ? AND stream_ordering > ? AND stream_ordering <= ?"
            " ORDER BY stream_ordering ASC",
            user_id,
            from_stream,
            to_stream,
        )
        return [(r[0], r[1], r[2], int(r[3])) for r in rows]
