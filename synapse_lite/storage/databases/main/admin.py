"""What the admin API reads and changes that no other store offers: users
listed with filters and paging, a user's admin flag, reactivation, every
room's id, a user's uploads and who uploaded how much.

``users`` is no stream's table: any process may write these rows.
"""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.storage._base import SQLBaseStore

#: ``order_by`` of ``GET /_synapse/admin/v2/users`` -> the SQL it sorts by.
#: ``user_type`` and ``locked`` are accepted (the admin UI sends them) but
#: every user has the same value: they sort by name.
USER_ORDERINGS = {
    "name": "u.name",
    "is_guest": "u.is_guest",
    "admin": "u.admin",
    "deactivated": "u.deactivated",
    # A user who never set a profile shows their localpart: close enough to
    # sort by without splitting ids in SQL.
    "displayname": "CASE WHEN p.user_id IS NULL THEN SUBSTR(u.name, 2)"
    " ELSE COALESCE(p.displayname, '') END",
    "avatar_url": "COALESCE(p.avatar_url, '')",
    "creation_ts": "u.creation_ts",
    "last_seen_ts": "COALESCE(s.last_seen, 0)",
    "user_type": "u.name",
    "shadow_banned": "u.shadow_banned",
    "locked": "u.name",
}

#: ``order_by`` of ``GET /v1/users/{userId}/media``. This server keeps no
#: access times: that order sorts by creation.
MEDIA_ORDERINGS = {
    "media_id": "media_id",
    "upload_name": "COALESCE(upload_name, '')",
    "created_ts": "created_ts",
    "last_access_ts": "created_ts",
    "media_length": "COALESCE(media_length, 0)",
    "media_type": "COALESCE(media_type, '')",
    "quarantined_by": "COALESCE(quarantined_by, '')",
    "safe_from_quarantine": "safe_from_quarantine",
}

#: ``order_by`` of ``GET /v1/statistics/users/media``.
STATISTICS_ORDERINGS = {
    "user_id": "user_id",
    "displayname": "COALESCE(displayname, '')",
    "media_length": "media_length",
    "media_count": "media_count",
}

_USER_COLUMNS = (
    "u.name, u.is_guest, u.admin, u.deactivated, u.erased_at_position, u.creation_ts,"
    " p.displayname, p.avatar_url, s.last_seen, p.user_id, u.shadow_banned, u.suspended"
)
_USER_FROM = (
    "users AS u LEFT JOIN profiles AS p ON p.user_id = u.name"
    " LEFT JOIN (SELECT user_id, MAX(last_seen) AS last_seen FROM user_ips GROUP BY user_id)"
    " AS s ON s.user_id = u.name"
)


def like_escape(text: str) -> str:
    """``text`` matching itself only in a ``LIKE ... ESCAPE '\\'`` pattern."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def like_pattern(text: str) -> str:
    """A case-folded ``LIKE ... ESCAPE '\\'`` pattern matching ``text`` anywhere."""
    return f"%{like_escape(text.lower())}%"


@attr.s(slots=True, frozen=True, auto_attribs=True, kw_only=True)
class UserQuery:
    """The filters and order of a users listing."""

    user_id: str | None = None
    name: str | None = None
    guests: bool = True
    deactivated: bool = False
    admins: bool | None = None
    order_by: str = "name"
    descending: bool = False


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AdminUserRow:
    """A user as the admin API lists it."""

    user_id: str
    is_guest: bool
    admin: bool
    deactivated: bool
    erased: bool
    creation_ts: int
    displayname: str | None
    avatar_url: str | None
    last_seen_ts: int | None
    shadow_banned: bool
    suspended: bool


def _user_row(r: tuple[Any, ...]) -> AdminUserRow:
    return AdminUserRow(
        user_id=r[0],
        is_guest=bool(r[1]),
        admin=bool(r[2]),
        deactivated=bool(r[3]),
        erased=r[4] is not None,
        creation_ts=int(r[5]),
        # No profile row: the defaults (``handlers/profile.py``'s ``profile_of``).
        displayname=r[6] if r[9] is not None else r[0][1:].split(":", 1)[0],
        avatar_url=r[7],
        last_seen_ts=None if r[8] is None else int(r[8]),
        shadow_banned=bool(r[10]),
        suspended=bool(r[11]),
    )


class AdminWorkerStore(SQLBaseStore):
    """Admin reads and writes of ``users``."""

    async def list_users(
        self, query: UserQuery, offset: int, limit: int
    ) -> tuple[list[AdminUserRow], int]:
        """One page of the users ``query`` selects, and how many it selects."""
        clauses: list[str] = []
        args: list[Any] = []
        if query.user_id is not None:
            clauses.append("LOWER(u.name) LIKE ? ESCAPE '\\'")
            args.append(like_pattern(query.user_id))
        if query.name is not None:
            clauses.append(
                "(LOWER(u.name) LIKE ? ESCAPE '\\' OR LOWER(p.displayname) LIKE ? ESCAPE '\\')"
            )
            args += [like_pattern(query.name)] * 2
        if not query.guests:
            clauses.append("NOT u.is_guest")
        if not query.deactivated:
            clauses.append("NOT u.deactivated")
        if query.admins is not None:
            clauses.append("u.admin" if query.admins else "NOT u.admin")
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        direction = "DESC" if query.descending else "ASC"
        order = f"{USER_ORDERINGS[query.order_by]} {direction}, u.name {direction}"
        rows = await self.db_pool.select(
            "admin_list_users",
            f"SELECT {_USER_COLUMNS} FROM {_USER_FROM}{where} ORDER BY {order} LIMIT ? OFFSET ?",
            *args,
            limit,
            offset,
        )
        count = await self.db_pool.select(
            "admin_count_users", f"SELECT COUNT(*) FROM {_USER_FROM}{where}", *args
        )
        return [_user_row(r) for r in rows], int(count[0][0])

    async def get_admin_user(self, user_id: str) -> AdminUserRow | None:
        rows = await self.db_pool.select(
            "admin_get_user", f"SELECT {_USER_COLUMNS} FROM {_USER_FROM} WHERE u.name = ?", user_id
        )
        return _user_row(rows[0]) if rows else None

    async def set_user_admin(self, user_id: str, admin: bool) -> None:
        await self.db_pool.execute(
            "set_user_admin", "UPDATE users SET admin = ? WHERE name = ?", admin, user_id
        )

    async def reactivate_user(self, user_id: str) -> None:
        """Undo a deactivation (not an erasure: what was erased stays so)."""
        await self.db_pool.execute(
            "reactivate_user", "UPDATE users SET deactivated = FALSE WHERE name = ?", user_id
        )

    async def get_all_room_ids(self) -> list[str]:
        rows = await self.db_pool.select("get_all_room_ids", "SELECT room_id FROM rooms")
        return [r[0] for r in rows]

    async def list_user_media(
        self, user_id: str, offset: int, limit: int, order_by: str, descending: bool
    ) -> tuple[list[tuple[Any, ...]], int]:
        """One page of the media ``user_id`` uploaded: ``(media_id,
        media_type, media_length, upload_name, created_ts, quarantined_by,
        safe_from_quarantine)`` rows, and how many."""
        direction = "DESC" if descending else "ASC"
        order = f"{MEDIA_ORDERINGS[order_by]} {direction}, media_id {direction}"
        rows = await self.db_pool.select(
            "list_user_media",
            "SELECT media_id, media_type, media_length, upload_name, created_ts,"
            " quarantined_by, safe_from_quarantine"
            " FROM local_media WHERE user_id = ? AND uploaded_ts IS NOT NULL"
            f" ORDER BY {order} LIMIT ? OFFSET ?",
            user_id,
            limit,
            offset,
        )
        count = await self.db_pool.select(
            "count_user_media",
            "SELECT COUNT(*) FROM local_media WHERE user_id = ? AND uploaded_ts IS NOT NULL",
            user_id,
        )
        return [tuple(r) for r in rows], int(count[0][0])

    async def media_statistics(
        self, offset: int, limit: int, order_by: str, descending: bool, search_term: str | None
    ) -> tuple[list[tuple[Any, ...]], int]:
        """One page of ``(user_id, displayname, media_count, media_length)``
        of the users who uploaded media, and how many such users there are."""
        where = "m.uploaded_ts IS NOT NULL"
        args: list[Any] = []
        if search_term is not None:
            where += (
                " AND (LOWER(m.user_id) LIKE ? ESCAPE '\\'"
                " OR LOWER(p.displayname) LIKE ? ESCAPE '\\')"
            )
            args += [like_pattern(search_term)] * 2
        direction = "DESC" if descending else "ASC"
        grouped = (
            "SELECT m.user_id AS user_id, MAX(p.displayname) AS displayname,"
            " COUNT(*) AS media_count, SUM(COALESCE(m.media_length, 0)) AS media_length"
            " FROM local_media AS m LEFT JOIN profiles AS p ON p.user_id = m.user_id"
            f" WHERE {where} GROUP BY m.user_id"
        )
        rows = await self.db_pool.select(
            "media_statistics",
            f"SELECT user_id, displayname, media_count, media_length FROM ({grouped}) AS g"
            f" ORDER BY {STATISTICS_ORDERINGS[order_by]} {direction}, user_id {direction}"
            " LIMIT ? OFFSET ?",
            *args,
            limit,
            offset,
        )
        count = await self.db_pool.select(
            "count_media_statistics", f"SELECT COUNT(*) FROM ({grouped}) AS g", *args
        )
        return [tuple(r) for r in rows], int(count[0][0])


#: ``order_by`` of ``GET /v1/federation/destinations`` -> its column.
DESTINATION_ORDERINGS = {
    "destination": "destination",
    "retry_last_ts": "retry_last_ts",
    "retry_interval": "retry_interval",
    "failure_ts": "COALESCE(failure_ts, 0)",
    "last_successful_stream_ordering": "last_sent_stream_id",
}

_DESTINATION_COLUMNS = "destination, retry_last_ts, retry_interval, failure_ts, last_sent_stream_id"


def destination_json(row: tuple[Any, ...]) -> dict[str, Any]:
    """A ``destinations`` row as the admin API shows it. The stream position
    we keep is the to-device outbox's, given as
    ``last_successful_stream_ordering`` (no events are sent over federation
    yet)."""
    destination, retry_last_ts, retry_interval, failure_ts, last_sent = row
    return {
        "destination": destination,
        "retry_last_ts": int(retry_last_ts),
        "retry_interval": int(retry_interval),
        "failure_ts": None if failure_ts is None else int(failure_ts),
        "last_successful_stream_ordering": int(last_sent) or None,
    }


class AdminDestinationsWorkerStore(SQLBaseStore):
    """The federation destinations as the admin API lists them (read only)."""

    async def list_destinations(
        self, offset: int, limit: int, order_by: str, descending: bool, search: str | None
    ) -> tuple[list[dict[str, Any]], int]:
        where, args = "", []
        if search is not None:
            where = " WHERE LOWER(destination) LIKE ? ESCAPE '\\'"
            args.append(like_pattern(search))
        direction = "DESC" if descending else "ASC"
        order = f"{DESTINATION_ORDERINGS[order_by]} {direction}, destination {direction}"
        rows = await self.db_pool.select(
            "admin_list_destinations",
            f"SELECT {_DESTINATION_COLUMNS} FROM destinations{where}"
            f" ORDER BY {order} LIMIT ? OFFSET ?",
            *args,
            limit,
            offset,
        )
        count = await self.db_pool.select(
            "admin_count_destinations", f"SELECT COUNT(*) FROM destinations{where}", *args
        )
        return [destination_json(tuple(r)) for r in rows], int(count[0][0])

    async def get_destination(self, destination: str) -> dict[str, Any] | None:
        rows = await self.db_pool.select(
            "admin_get_destination",
            f"SELECT {_DESTINATION_COLUMNS} FROM destinations WHERE destination = ?",
            destination,
        )
        return destination_json(tuple(rows[0])) if rows else None

    async def list_destination_rooms(
        self, destination: str, offset: int, limit: int, descending: bool
    ) -> tuple[list[str], int]:
        """A page of the rooms a user of ``destination`` is joined to now
        (by room id) and how many there are."""
        where = (
            " FROM current_state_events WHERE type = 'm.room.member' AND membership = 'join'"
            " AND state_key LIKE ? ESCAPE '\\'"
        )
        pattern = f"%:{like_escape(destination)}"
        direction = "DESC" if descending else "ASC"
        rows = await self.db_pool.select(
            "admin_list_destination_rooms",
            f"SELECT DISTINCT room_id{where} ORDER BY room_id {direction} LIMIT ? OFFSET ?",
            pattern,
            limit,
            offset,
        )
        count = await self.db_pool.select(
            "admin_count_destination_rooms", f"SELECT COUNT(DISTINCT room_id){where}", pattern
        )
        return [str(r[0]) for r in rows], int(count[0][0])
