"""Reports of rooms, events and users (``content_reports``), and OpenID
tokens (``openid_tokens``): plain tables no stream owns, written by whichever
process the request reached."""

from __future__ import annotations

from synapse_lite.storage._base import SQLBaseStore


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
