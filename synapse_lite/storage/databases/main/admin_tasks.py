"""The admin API's long jobs (``admin_tasks``), blocked rooms
(``blocked_rooms``) and what a room purge removes. Plain tables no stream
owns: any process reads them; the process running a job writes its row."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.storage._base import SQLBaseStore, db_to_json, json_encoder
from synapse_lite.storage.database import LoggingTransaction

#: A job not begun yet / under way / done / given up.
SCHEDULED = "scheduled"
ACTIVE = "active"
COMPLETE = "complete"
FAILED = "failed"
UNFINISHED = (SCHEDULED, ACTIVE)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AdminTask:
    """A row of ``admin_tasks``."""

    task_id: str
    action: str
    resource_id: str
    params: dict[str, Any]
    status: str
    result: dict[str, Any]
    error: str | None
    created_ts: int


_TASK_COLUMNS = "task_id, action, resource_id, params, status, result, error, created_ts"


def _task(r: tuple[Any, ...]) -> AdminTask:
    return AdminTask(
        task_id=r[0],
        action=r[1],
        resource_id=r[2],
        params=db_to_json(r[3]),
        status=r[4],
        result=db_to_json(r[5]),
        error=r[6],
        created_ts=int(r[7]),
    )


class AdminTasksWorkerStore(SQLBaseStore):
    """Recording and reading the admin API's jobs; blocking rooms."""

    async def insert_admin_task(
        self, task_id: str, action: str, resource_id: str, params: dict[str, Any]
    ) -> None:
        now = self.clock.time_msec()
        await self.db_pool.execute(
            "insert_admin_task",
            f"INSERT INTO admin_tasks ({_TASK_COLUMNS}, updated_ts)"
            " VALUES (?, ?, ?, ?, ?, ?, NULL, ?, ?)",
            task_id,
            action,
            resource_id,
            json_encoder(params),
            SCHEDULED,
            json_encoder({}),
            now,
            now,
        )

    async def update_admin_task(
        self, task_id: str, status: str, result: dict[str, Any], error: str | None = None
    ) -> None:
        await self.db_pool.execute(
            "update_admin_task",
            "UPDATE admin_tasks SET status = ?, result = ?, error = ?, updated_ts = ?"
            " WHERE task_id = ?",
            status,
            json_encoder(result),
            error,
            self.clock.time_msec(),
            task_id,
        )

    async def get_admin_task(self, task_id: str) -> AdminTask | None:
        rows = await self.db_pool.select(
            "get_admin_task", f"SELECT {_TASK_COLUMNS} FROM admin_tasks WHERE task_id = ?", task_id
        )
        return _task(rows[0]) if rows else None

    async def get_admin_tasks_for(self, action: str, resource_id: str) -> list[AdminTask]:
        """The jobs of ``action`` on ``resource_id``, oldest first."""
        rows = await self.db_pool.select(
            "get_admin_tasks_for",
            f"SELECT {_TASK_COLUMNS} FROM admin_tasks WHERE action = ? AND resource_id = ?"
            " ORDER BY created_ts, task_id",
            action,
            resource_id,
        )
        return [_task(r) for r in rows]

    async def get_unfinished_admin_tasks(self, action: str) -> list[AdminTask]:
        """The jobs of ``action`` not complete nor failed, oldest first."""
        rows = await self.db_pool.select(
            "get_unfinished_admin_tasks",
            f"SELECT {_TASK_COLUMNS} FROM admin_tasks WHERE action = ? AND status IN (?, ?)"
            " ORDER BY created_ts, task_id",
            action,
            *UNFINISHED,
        )
        return [_task(r) for r in rows]

    # Blocked rooms

    async def block_room(self, room_id: str, user_id: str) -> None:
        """Block ``room_id`` (``user_id``: the admin); blocking twice keeps the first."""
        await self.db_pool.execute(
            "block_room",
            "INSERT INTO blocked_rooms (room_id, user_id) VALUES (?, ?)"
            " ON CONFLICT (room_id) DO NOTHING",
            room_id,
            user_id,
        )

    async def is_room_blocked(self, room_id: str) -> bool:
        return await self.get_room_blocker(room_id) is not None

    async def get_room_blocker(self, room_id: str) -> str | None:
        """The admin who blocked the room; None if it is not blocked."""
        rows = await self.db_pool.select(
            "get_room_blocker", "SELECT user_id FROM blocked_rooms WHERE room_id = ?", room_id
        )
        return rows[0][0] if rows else None

    async def unblock_room(self, room_id: str) -> None:
        await self.db_pool.execute(
            "unblock_room", "DELETE FROM blocked_rooms WHERE room_id = ?", room_id
        )

    # Purging a room

    async def get_room_event_ids_after(
        self, room_id: str, after: int | None, limit: int
    ) -> list[tuple[int, str]]:
        """``(stream_ordering, event_id)`` of the room's events past ``after``
        (from the first when None), in stream order, at most ``limit``."""
        if after is None:
            rows = await self.db_pool.select(
                "get_room_event_ids_after",
                "SELECT stream_ordering, event_id FROM events WHERE room_id = ?"
                " ORDER BY stream_ordering LIMIT ?",
                room_id,
                limit,
            )
        else:
            rows = await self.db_pool.select(
                "get_room_event_ids_after",
                "SELECT stream_ordering, event_id FROM events WHERE room_id = ?"
                " AND stream_ordering > ? ORDER BY stream_ordering LIMIT ?",
                room_id,
                after,
                limit,
            )
        return [(int(r[0]), r[1]) for r in rows]

    async def delete_room_search_rows(self, room_id: str) -> None:
        """Forget the room's events in the search index (``event_search``)."""
        await self.db_pool.execute(
            "delete_room_search_rows", "DELETE FROM event_search WHERE room_id = ?", room_id
        )

    async def delete_event_search_rows(self, events: list[tuple[int, str]]) -> None:
        """Forget these ``(stream_ordering, event_id)`` events in the search
        index (SQLite's rows are keyed by stream ordering, PostgreSQL's by id)."""

        def txn_func(txn: LoggingTransaction) -> None:
            if txn.database_engine.name == "postgres":
                txn.execute_batch(
                    "DELETE FROM event_search WHERE event_id = ?", [(e,) for _, e in events]
                )
            else:
                txn.execute_batch(
                    "DELETE FROM event_search WHERE rowid = ?", [(o,) for o, _ in events]
                )

        await self.db_pool.runInteraction("delete_event_search_rows", txn_func)

    async def get_last_event_before_ts(self, room_id: str, ts: int) -> int | None:
        """The stream ordering of the room's last event sent before ``ts``
        (by ``origin_server_ts``), or None."""
        rows = await self.db_pool.select(
            "get_last_event_before_ts",
            "SELECT MAX(stream_ordering) FROM events"
            " WHERE room_id = ? AND origin_server_ts < ? AND stream_ordering > 0",
            room_id,
            ts,
        )
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    async def get_event_near_ts(
        self, room_id: str, ts: int, forwards: bool
    ) -> tuple[str, int] | None:
        """The room's event (its id and ``origin_server_ts``) sent closest
        to ``ts``: the first at or after it (``forwards``) or the last at or
        before it; None when there is none. Ties go to the earlier (forwards)
        or later event in the stream."""
        order = "ASC" if forwards else "DESC"
        rows = await self.db_pool.select(
            "get_event_near_ts",
            "SELECT event_id, origin_server_ts FROM events WHERE room_id = ?"
            f" AND origin_server_ts {'>=' if forwards else '<='} ? AND stream_ordering > 0"
            f" ORDER BY origin_server_ts {order}, stream_ordering {order} LIMIT 1",
            room_id,
            ts,
        )
        return (str(rows[0][0]), int(rows[0][1])) if rows else None

    async def get_rooms_to_redact_in(self, user_id: str) -> list[str]:
        """The rooms ``user_id`` is joined to or banned from now, sorted
        (a user redaction's default rooms)."""
        rows = await self.db_pool.select(
            "get_rooms_to_redact_in",
            "SELECT room_id FROM current_state_events WHERE type = 'm.room.member'"
            " AND state_key = ? AND membership IN ('join', 'ban') ORDER BY room_id",
            user_id,
        )
        return [str(r[0]) for r in rows]

    async def get_events_to_redact(
        self,
        user_id: str,
        room_id: str,
        limit: int,
        after_ts: int | None,
        before_ts: int | None,
    ) -> list[str]:
        """Up to ``limit`` of ``user_id``'s events in the room, newest
        first, that a user redaction redacts: messages and the other
        non-state events but redactions, and their joins (which carry their
        name and avatar), sent at or after ``after_ts`` and at or before
        ``before_ts``, and not redacted yet."""
        clauses: list[str] = []
        args: list[Any] = [room_id, user_id]
        if after_ts is not None:
            clauses.append(" AND e.origin_server_ts >= ?")
            args.append(after_ts)
        if before_ts is not None:
            clauses.append(" AND e.origin_server_ts <= ?")
            args.append(before_ts)
        rows = await self.db_pool.select(
            "get_events_to_redact",
            "SELECT e.event_id FROM events AS e WHERE e.room_id = ? AND e.sender = ?"
            " AND NOT e.outlier AND e.type != 'm.room.redaction'"
            " AND (e.state_key IS NULL OR (e.type = 'm.room.member' AND e.membership = 'join'))"
            + "".join(clauses)
            + " AND NOT EXISTS (SELECT 1 FROM events AS r WHERE r.redacts = e.event_id)"
            " ORDER BY e.stream_ordering DESC LIMIT ?",
            *args,
            limit,
        )
        return [str(r[0]) for r in rows]

    async def list_admin_tasks(
        self,
        action: str | None,
        resource_id: str | None,
        status: str | None,
        max_timestamp: int | None,
    ) -> list[tuple[AdminTask, int]]:
        """Every job of ``admin_tasks`` matching the filters given (each
        None for any; ``max_timestamp`` bounds when it last changed),
        newest first, each with when it last changed."""
        clauses: list[str] = []
        args: list[Any] = []
        for column, value in (("action", action), ("resource_id", resource_id), ("status", status)):
            if value is not None:
                clauses.append(f"{column} = ?")
                args.append(value)
        if max_timestamp is not None:
            clauses.append("updated_ts < ?")
            args.append(max_timestamp)
        where = (" WHERE " + " AND ".join(clauses)) if clauses else ""
        rows = await self.db_pool.select(
            "list_admin_tasks",
            f"SELECT {_TASK_COLUMNS}, updated_ts FROM admin_tasks{where}"
            " ORDER BY updated_ts DESC, task_id",
            *args,
        )
        return [(_task(tuple(r[:-1])), int(r[-1])) for r in rows]

    async def get_largest_rooms(self, limit: int) -> list[tuple[str, int]]:
        """The ``limit`` rooms whose events take the most room, largest
        first, each with an estimate in bytes: their content's length plus
        a fixed cost a row (ids, indexes). Reads every event: the admin
        API's statistics only."""
        rows = await self.db_pool.select(
            "get_largest_rooms",
            "SELECT room_id, SUM(LENGTH(content)) + 200 * COUNT(*) AS size FROM events"
            " GROUP BY room_id ORDER BY size DESC, room_id LIMIT ?",
            limit,
        )
        return [(str(r[0]), int(r[1])) for r in rows]

    async def count_invites_sent(self, user_id: str, from_ts: int) -> int:
        """How many invites ``user_id`` sent at or after ``from_ts``."""
        rows = await self.db_pool.select(
            "count_invites_sent",
            "SELECT COUNT(*) FROM events WHERE sender = ? AND type = 'm.room.member'"
            " AND membership = 'invite' AND state_key != sender AND origin_server_ts >= ?",
            user_id,
            from_ts,
        )
        return int(rows[0][0])

    async def count_rooms_joined(self, user_id: str, from_ts: int) -> int:
        """How many rooms ``user_id`` joined at or after ``from_ts``, whether
        they are still in them or not."""
        rows = await self.db_pool.select(
            "count_rooms_joined",
            "SELECT COUNT(DISTINCT room_id) FROM events WHERE type = 'm.room.member'"
            " AND state_key = ? AND membership = 'join' AND origin_server_ts >= ?",
            user_id,
            from_ts,
        )
        return int(rows[0][0])

    async def get_members_to_remove(self, room_id: str) -> list[str]:
        """Who is joined to, invited to or knocking on the room now, sorted."""
        rows = await self.db_pool.select(
            "get_members_to_remove",
            "SELECT state_key FROM current_state_events WHERE room_id = ?"
            " AND type = 'm.room.member' AND membership IN ('join', 'invite', 'knock')"
            " ORDER BY state_key",
            room_id,
        )
        return [r[0] for r in rows]
