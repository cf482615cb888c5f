"""Profiles, room aliases, the public room directory and forgotten rooms.

None of these is a stream: whichever process serves the request writes the
row, and every process reads the database (nothing here is cached, so there
is nothing to invalidate across processes).
"""

from __future__ import annotations

from typing import Any

from synapse_lite.storage._base import SQLBaseStore, db_to_json
from synapse_lite.storage.database import LoggingTransaction

#: What a profile field is called in the API -> its column.
PROFILE_COLUMNS = {"displayname": "displayname", "avatar_url": "avatar_url"}


class ProfileWorkerStore(SQLBaseStore):
    # Profiles

    async def get_profile(self, user_id: str) -> dict[str, str | None] | None:
        """``{"displayname", "avatar_url"}`` as stored; None when no row."""
        rows = await self.db_pool.select(
            "get_profile",
            "SELECT displayname, avatar_url FROM profiles WHERE user_id = ?",
            user_id,
        )
        if not rows:
            return None
        return {"displayname": rows[0][0], "avatar_url": rows[0][1]}

    async def get_profiles(self, user_ids: list[str]) -> dict[str, dict[str, str | None]]:
        """The stored profiles of ``user_ids`` (users without a row are left out)."""
        rows = await self._select_users(
            "get_profiles",
            "SELECT user_id, displayname, avatar_url FROM profiles WHERE user_id IN ({marks})",
            user_ids,
        )
        return {
            user_id: {"displayname": name, "avatar_url": avatar} for user_id, name, avatar in rows
        }

    async def _select_users(
        self, desc: str, sql: str, user_ids: list[str]
    ) -> list[tuple[Any, ...]]:
        """The rows of ``sql`` (``{marks}``: the placeholders of the ids)
        for ``user_ids``, 500 at a time."""
        rows: list[tuple[Any, ...]] = []
        for start in range(0, len(user_ids), 500):
            chunk = user_ids[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            rows += await self.db_pool.select(desc, sql.format(marks=marks), *chunk)
        return rows

    async def set_profile_field(
        self, user_id: str, field: str, value: str | None, default_name: str
    ) -> None:
        """Set one field; a user's first write also records ``default_name`` as
        the display name (what they had until then)."""
        column = PROFILE_COLUMNS[field]

        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute(
                "INSERT INTO profiles (user_id, displayname, avatar_url) VALUES (?, ?, NULL)"
                " ON CONFLICT (user_id) DO NOTHING",
                (user_id, default_name),
            )
            txn.execute(f"UPDATE profiles SET {column} = ? WHERE user_id = ?", (value, user_id))

        await self.db_pool.runInteraction("set_profile_field", txn_func)

    async def get_member_profiles(self, user_ids: list[str]) -> dict[str, dict[str, str | None]]:
        """The profiles ``user_ids`` show in the rooms they are joined to
        (``displayname``, ``avatar_url`` of one of their current join
        events): what we know of other servers' users, who have no row in
        ``profiles`` here. Users joined nowhere are left out."""
        rows = await self._select_users(
            "get_member_profiles",
            "SELECT c.state_key, e.content FROM current_state_events AS c"
            " JOIN events AS e ON e.event_id = c.event_id"
            " WHERE c.type = 'm.room.member' AND c.membership = 'join'"
            " AND c.state_key IN ({marks}) ORDER BY c.state_key, c.room_id",
            user_ids,
        )
        result: dict[str, dict[str, str | None]] = {}
        for user_id, raw in rows:
            if user_id in result:
                continue
            content = db_to_json(raw)
            content = content if isinstance(content, dict) else {}
            result[user_id] = {
                field: value if isinstance(value, str) else None
                for field in ("displayname", "avatar_url")
                for value in [content.get(field)]
            }
        return result

    async def get_users_visible_to(self, user_id: str) -> set[str]:
        """Users the user directory shows ``user_id``: the others joined to a
        room ``user_id`` is joined to, and everyone joined to a public room
        (join rule public, or history world readable)."""
        rows = await self.db_pool.select(
            "get_users_visible_to",
            "SELECT DISTINCT m.state_key FROM current_state_events AS m"
            " WHERE m.type = 'm.room.member' AND m.membership = 'join' AND ("
            "  (m.state_key != ? AND m.room_id IN (SELECT room_id FROM current_state_events"
            "   WHERE type = 'm.room.member' AND membership = 'join' AND state_key = ?))"
            "  OR m.room_id IN (SELECT room_id FROM rooms WHERE is_public = ?)"
            "  OR m.room_id IN (SELECT c.room_id FROM current_state_events AS c"
            "   JOIN events AS e ON e.event_id = c.event_id"
            "   WHERE c.type = 'm.room.history_visibility' AND c.state_key = ''"
            # The content is JSON text: the value is matched with its quotes.
            "   AND e.content LIKE ?))",
            user_id,
            user_id,
            True,
            '%"world_readable"%',
        )
        return {r[0] for r in rows}

    # Room aliases

    async def get_alias(self, room_alias: str) -> tuple[str, str] | None:
        """``(room_id, creator)`` of an alias, or None."""
        rows = await self.db_pool.select(
            "get_alias",
            "SELECT room_id, creator FROM room_aliases WHERE room_alias = ?",
            room_alias,
        )
        return (rows[0][0], rows[0][1]) if rows else None

    async def create_alias(self, room_alias: str, room_id: str, creator: str) -> bool:
        """Add an alias; False when it already exists. It is recorded as
        made at the highest events stream position in the database when it
        is inserted (see :meth:`get_alias_positions_for_room`): read in the
        inserting transaction, not from this process's view of the stream,
        which may lag behind the writers (a reader serves ``PUT
        /directory/room``); and below every event of a room that has none
        yet (``createRoom`` claims its alias before the room's first
        events are written)."""

        def txn_func(txn: LoggingTransaction) -> bool:
            txn.execute("SELECT COALESCE(MAX(stream_ordering), 0) FROM events")
            row = txn.fetchone()
            made_at = int(row[0]) if row else 0
            txn.execute(
                "INSERT INTO room_aliases (room_alias, room_id, creator, stream_ordering)"
                " VALUES (?, ?, ?, ?) ON CONFLICT (room_alias) DO NOTHING",
                (room_alias, room_id, creator, made_at),
            )
            return txn.rowcount == 1

        return await self.db_pool.runInteraction("create_alias", txn_func)

    async def delete_alias(self, room_alias: str) -> None:
        await self.db_pool.execute(
            "delete_alias", "DELETE FROM room_aliases WHERE room_alias = ?", room_alias
        )

    async def move_aliases(self, from_room: str, to_room: str) -> None:
        """Point every alias of ``from_room`` at ``to_room`` (a room upgrade)."""
        await self.db_pool.execute(
            "move_aliases",
            "UPDATE room_aliases SET room_id = ? WHERE room_id = ?",
            to_room,
            from_room,
        )

    async def get_aliases_for_room(self, room_id: str) -> list[str]:
        rows = await self.db_pool.select(
            "get_aliases_for_room",
            "SELECT room_alias FROM room_aliases WHERE room_id = ? ORDER BY room_alias",
            room_id,
        )
        return [r[0] for r in rows]

    async def get_alias_positions_for_room(self, room_id: str) -> list[tuple[str, int]]:
        """The room's aliases, each with the events stream position it was
        made at: it names the room for events written after that position."""
        rows = await self.db_pool.select(
            "get_alias_positions_for_room",
            "SELECT room_alias, stream_ordering FROM room_aliases WHERE room_id = ?"
            " ORDER BY room_alias",
            room_id,
        )
        return [(r[0], int(r[1])) for r in rows]

    # The public room directory

    async def set_room_in_directory(self, room_id: str, listed: bool) -> None:
        await self.db_pool.execute(
            "set_room_in_directory",
            "UPDATE rooms SET in_directory = ? WHERE room_id = ?",
            listed,
            room_id,
        )

    async def is_room_in_directory(self, room_id: str) -> bool | None:
        """Whether the room is listed; None for an unknown room."""
        rows = await self.db_pool.select(
            "is_room_in_directory", "SELECT in_directory FROM rooms WHERE room_id = ?", room_id
        )
        return bool(rows[0][0]) if rows else None

    async def get_directory_room_ids(self) -> list[str]:
        """Every listed room, oldest first (a stable order for paging)."""
        rows = await self.db_pool.select(
            "get_directory_room_ids",
            "SELECT room_id FROM rooms WHERE in_directory = ? ORDER BY creation_ts, room_id",
            True,
        )
        return [r[0] for r in rows]

    async def set_room_in_appservice_list(
        self, appservice_id: str, network_id: str, room_id: str, listed: bool
    ) -> None:
        """Publish (or withdraw) ``room_id`` in the list of one network of
        one application service; idempotent both ways."""
        if listed:
            await self.db_pool.execute(
                "set_room_in_appservice_list",
                "INSERT INTO appservice_room_list (appservice_id, network_id, room_id)"
                " VALUES (?, ?, ?)"
                " ON CONFLICT (appservice_id, network_id, room_id) DO NOTHING",
                appservice_id,
                network_id,
                room_id,
            )
        else:
            await self.db_pool.execute(
                "set_room_in_appservice_list",
                "DELETE FROM appservice_room_list"
                " WHERE appservice_id = ? AND network_id = ? AND room_id = ?",
                appservice_id,
                network_id,
                room_id,
            )

    async def get_appservice_list_room_ids(self, network: tuple[str, str] | None) -> list[str]:
        """The rooms published by application services, oldest first:
        those of ``network`` (an ``(appservice_id, network_id)``) only, or of
        every network of every service when it is None."""
        where: str = ""
        args: tuple[str, ...] = ()
        if network is not None:
            where, args = " WHERE l.appservice_id = ? AND l.network_id = ?", network
        rows = await self.db_pool.select(
            "get_appservice_list_room_ids",
            "SELECT DISTINCT r.room_id, r.creation_ts FROM appservice_room_list AS l"
            " JOIN rooms AS r ON r.room_id = l.room_id"
            + where
            + " ORDER BY r.creation_ts, r.room_id",
            *args,
        )
        return [r[0] for r in rows]

    # Forgotten rooms

    async def forget_room(self, user_id: str, room_id: str) -> None:
        await self.db_pool.execute(
            "forget_room",
            "INSERT INTO forgotten_rooms (user_id, room_id) VALUES (?, ?)"
            " ON CONFLICT (user_id, room_id) DO NOTHING",
            user_id,
            room_id,
        )

    async def get_forgotten_rooms(self, user_id: str) -> set[str]:
        rows = await self.db_pool.select(
            "get_forgotten_rooms", "SELECT room_id FROM forgotten_rooms WHERE user_id = ?", user_id
        )
        return {r[0] for r in rows}

    async def unforget_room(self, user_id: str, room_id: str) -> None:
        """A user back in a room has not forgotten it any more."""
        await self.db_pool.execute(
            "unforget_room",
            "DELETE FROM forgotten_rooms WHERE user_id = ? AND room_id = ?",
            user_id,
            room_id,
        )
