"""Room membership: who is in which room, now and when it changed."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, NamedTuple

from synapse_lite.storage._base import db_to_json
from synapse_lite.storage.caches import cached
from synapse_lite.storage.databases.main.stream import StreamWorkerStore
from synapse_lite.tokens import RoomStreamToken

#: A membership change: ``(room_id, membership, event_id, stream_ordering, instance_name)``.
MembershipRow = tuple[str, str, str, int, str]


class MemberChange(NamedTuple):
    """A change of a room's current membership: the user whose it is, the
    stream id of the event that made it, and the membership it replaced
    (None: the user had none)."""

    room_id: str
    user_id: str
    stream_id: int
    replaced: str | None


#: Lower than any stream id, to read "from the beginning" with a token.
_BEGINNING = RoomStreamToken(-(2**62))


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

    @cached()
    async def get_local_memberships_with_positions(self, user_id: str) -> tuple[MembershipRow, ...]:
        """A local user's current membership of every room they have one in,
        with where the deciding event sits in the events stream. Cached;
        forgotten with ``get_rooms_for_user`` when their membership changes."""
        rows = await self.db_pool.select(
            "get_local_memberships_with_positions",
            "SELECT l.room_id, l.membership, l.event_id, l.event_stream_ordering, e.instance_name"
            " FROM local_current_membership AS l JOIN events AS e ON e.event_id = l.event_id"
            " WHERE l.user_id = ?",
            user_id,
        )
        return tuple((r[0], r[1], r[2], int(r[3]), r[4]) for r in rows)

    async def get_membership_changes_between(
        self, user_id: str, from_token: RoomStreamToken | None, to_token: RoomStreamToken
    ) -> list[MembershipRow]:
        """A user's membership events after ``from_token`` (from the beginning
        when None) and at or before ``to_token``, oldest first."""
        where, args = (from_token or _BEGINNING).bounds_sql(
            to_token, "m.stream_ordering", "e.instance_name"
        )
        rows = await self.db_pool.select(
            "get_membership_changes_between",
            "SELECT m.room_id, m.membership, m.event_id, m.stream_ordering, e.instance_name"
            " FROM room_memberships AS m JOIN events AS e ON e.event_id = m.event_id"
            f" WHERE m.user_id = ? AND {where} ORDER BY m.stream_ordering ASC",
            user_id,
            *args,
        )
        return [(r[0], r[1], r[2], int(r[3]), r[4]) for r in rows]

    async def get_membership_at(
        self, user_id: str, room_id: str, token: RoomStreamToken
    ) -> MembershipRow | None:
        """A user's membership of a room as of ``token`` (None: never a member)."""
        where, args = _BEGINNING.bounds_sql(token, "m.stream_ordering", "e.instance_name")
        rows = await self.db_pool.select(
            "get_membership_at",
            "SELECT m.room_id, m.membership, m.event_id, m.stream_ordering, e.instance_name"
            " FROM room_memberships AS m JOIN events AS e ON e.event_id = m.event_id"
            f" WHERE m.user_id = ? AND m.room_id = ? AND {where}"
            " ORDER BY m.stream_ordering DESC LIMIT 1",
            user_id,
            room_id,
            *args,
        )
        if not rows:
            return None
        r = rows[0]
        return (r[0], r[1], r[2], int(r[3]), r[4])

    async def get_membership_history(self, user_id: str, room_id: str) -> list[tuple[int, str]]:
        """Every membership a user has had in a room: ``(stream_ordering,
        membership)``, oldest first. Within one room stream order is the order
        of persistence (a room has one writer, which persists it in turn)."""
        rows = await self.db_pool.select(
            "get_membership_history",
            "SELECT stream_ordering, membership FROM room_memberships"
            " WHERE user_id = ? AND room_id = ? ORDER BY stream_ordering ASC",
            user_id,
            room_id,
        )
        return [(int(r[0]), r[1]) for r in rows]

    async def get_member_changes_after(
        self, room_ids: Collection[str], stream_id: int
    ) -> list[MemberChange]:
        """The changes of ``room_ids``' current memberships made by events
        after ``stream_id``, oldest first, each with the membership it
        replaced: what undoes them, to know who was joined at ``stream_id``."""
        if not room_ids:
            return []
        marks = ", ".join("?" for _ in room_ids)
        rows = await self.db_pool.select(
            "get_member_changes_after",
            "SELECT d.room_id, d.state_key, d.stream_id, e.membership"
            " FROM current_state_delta_stream AS d"
            " LEFT JOIN events AS e ON e.event_id = d.prev_event_id"
            " WHERE d.stream_id > ? AND d.type = 'm.room.member'"
            f" AND d.room_id IN ({marks}) ORDER BY d.stream_id ASC",
            stream_id,
            *sorted(room_ids),
        )
        return [MemberChange(r[0], r[1], int(r[2]), r[3]) for r in rows]

    async def get_rooms_ever_in(self, user_id: str) -> list[str]:
        """Every room the user has ever had a membership in (invited, joined,
        left...), sorted."""
        rows = await self.db_pool.select(
            "get_rooms_ever_in",
            "SELECT DISTINCT room_id FROM room_memberships WHERE user_id = ? ORDER BY room_id",
            user_id,
        )
        return [r[0] for r in rows]

    async def get_member_content_at(
        self, room_id: str, user_id: str, position: int
    ) -> dict[str, Any] | None:
        """The content of the user's membership event in force in the room at
        stream ordering ``position`` (their profile there then), or None."""
        rows = await self.db_pool.select(
            "get_member_content_at",
            "SELECT e.content FROM room_memberships AS m JOIN events AS e"
            " ON e.event_id = m.event_id WHERE m.room_id = ? AND m.user_id = ?"
            " AND m.stream_ordering <= ? ORDER BY m.stream_ordering DESC LIMIT 1",
            room_id,
            user_id,
            position,
        )
        return db_to_json(rows[0][0]) if rows else None
