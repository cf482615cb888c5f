"""Reports of rooms, events and users (``content_reports``; the admin API
lists and deletes the reports of events), and OpenID
tokens (``openid_tokens``): plain tables no stream owns, written by whichever
process the request reached."""

from __future__ import annotations

from typing import Any

from synapse_lite.storage._base import SQLBaseStore
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.admin import like_pattern

_REPORT_COLUMNS = "id, received_ts, room_id, event_id, reporter, reason"


class ContentReportsWorkerStore(SQLBaseStore):
    """Recording reports; issuing and checking OpenID tokens."""

    async def add_content_report(
        self,
        reporter: str,
        room_id: str | None,
        event_id: str | None,
        reported_user_id: str | None,
        reason: str | None,
    ) -> None:
        await self.db_pool.execute(
            "add_content_report",
            "INSERT INTO content_reports"
            " (reporter, received_ts, room_id, event_id, reported_user_id, reason)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            reporter,
            self.clock.time_msec(),
            room_id,
            event_id,
            reported_user_id,
            reason,
        )

    async def add_openid_token(self, token_hash: str, user_id: str, valid_until_ms: int) -> None:
        """Store a new token, and drop those expired an hour ago or more."""
        await self.db_pool.execute(
            "delete_expired_openid_tokens",
            "DELETE FROM openid_tokens WHERE valid_until_ms < ?",
            self.clock.time_msec() - 3_600_000,
        )
        await self.db_pool.execute(
            "add_openid_token",
            "INSERT INTO openid_tokens (token_hash, user_id, valid_until_ms) VALUES (?, ?, ?)",
            token_hash,
            user_id,
            valid_until_ms,
        )

    async def get_user_by_openid_token(self, token_hash: str) -> str | None:
        """The user an unexpired OpenID token was issued to, or None."""
        rows = await self.db_pool.select(
            "get_user_by_openid_token",
            "SELECT user_id FROM openid_tokens WHERE token_hash = ? AND valid_until_ms > ?",
            token_hash,
            self.clock.time_msec(),
        )
        return rows[0][0] if rows else None

    # Reading and deleting reports (the admin API)

    async def list_event_reports(
        self,
        offset: int,
        limit: int,
        descending: bool,
        reporter: str | None,
        room_id: str | None,
    ) -> tuple[list[tuple[Any, ...]], int]:
        """One page of the reports of events (oldest first, or newest with
        ``descending``): ``(id, received_ts, room_id, event_id, reporter,
        reason)`` rows, and how many there are."""
        clauses = ["event_id IS NOT NULL"]
        args: list[Any] = []
        if reporter is not None:
            clauses.append("LOWER(reporter) LIKE ? ESCAPE '\\'")
            args.append(like_pattern(reporter))
        if room_id is not None:
            clauses.append("LOWER(room_id) LIKE ? ESCAPE '\\'")
            args.append(like_pattern(room_id))
        where = " AND ".join(clauses)
        direction = "DESC" if descending else "ASC"
        rows = await self.db_pool.select(
            "list_event_reports",
            f"SELECT {_REPORT_COLUMNS} FROM content_reports WHERE {where}"
            f" ORDER BY received_ts {direction}, id {direction} LIMIT ? OFFSET ?",
            *args,
            limit,
            offset,
        )
        count = await self.db_pool.select(
            "count_event_reports", f"SELECT COUNT(*) FROM content_reports WHERE {where}", *args
        )
        return [tuple(r) for r in rows], int(count[0][0])

    async def get_event_report(self, report_id: int) -> tuple[Any, ...] | None:
        """A report of an event, as :meth:`list_event_reports` gives it."""
        rows = await self.db_pool.select(
            "get_event_report",
            f"SELECT {_REPORT_COLUMNS} FROM content_reports WHERE id = ? AND event_id IS NOT NULL",
            report_id,
        )
        return tuple(rows[0]) if rows else None

    async def delete_event_report(self, report_id: int) -> bool:
        """Whether there was such a report of an event."""

        def txn_func(txn: LoggingTransaction) -> bool:
            txn.execute(
                "DELETE FROM content_reports WHERE id = ? AND event_id IS NOT NULL", (report_id,)
            )
            return txn.rowcount > 0

        return await self.db_pool.runInteraction("delete_event_report", txn_func)
