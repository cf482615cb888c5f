"""Users and their access tokens (stored as SHA-256 hashes only)."""

from __future__ import annotations

from typing import Any

from synapse_lite.storage.caches import cached
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.cache import CacheInvalidationWorkerStore
from synapse_lite.storage.databases.main.devices import DeviceWorkerStore


class UserExistsError(Exception):
    """The user id is taken."""


class RegistrationWorkerStore(DeviceWorkerStore, CacheInvalidationWorkerStore):
    """Users, devices' access tokens, and looking a token up on every request."""

    async def register_user(
        self, user_id: str, password_hash: str | None, admin: bool = False
    ) -> None:
        """Create a user; raises :class:`UserExistsError` if the id is taken."""

        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute(
                "INSERT INTO users (name, password_hash, creation_ts, admin) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                (user_id, password_hash, self.clock.time_msec(), admin),
            )
            if txn.rowcount == 0:
                raise UserExistsError(user_id)

        await self.db_pool.runInteraction("register_user", txn_func)

    async def get_user(self, user_id: str) -> dict[str, Any] | None:
        rows = await self.db_pool.select(
            "get_user",
            "SELECT name, password_hash, creation_ts, admin, deactivated FROM users WHERE name = ?",
            user_id,
        )
        if not rows:
            return None
        r = rows[0]
        return {
            "user_id": r[0],
            "password_hash": r[1],
            "creation_ts": int(r[2]),
            "admin": bool(r[3]),
            "deactivated": bool(r[4]),
        }

    async def add_access_token(
        self, user_id: str, device_id: str, token_hash: str, device_display_name: str | None
    ) -> bool:
        """Record a token for a (possibly new) device; returns whether the
        device is new."""

        def txn_func(txn: LoggingTransaction) -> bool:
            new_device = self.store_device_txn(txn, user_id, device_id, device_display_name)
            txn.execute(
                "INSERT INTO access_tokens (token_hash, user_id, device_id, created_ts)"
                " VALUES (?, ?, ?, ?)",
                (token_hash, user_id, device_id, self.clock.time_msec()),
            )
            return new_device

        return await self.db_pool.runInteraction("add_access_token", txn_func)

    @cached(max_entries=100_000)
    async def get_user_by_access_token(self, token_hash: str) -> tuple[str, str] | None:
        """``(user_id, device_id)`` owning a token, or None."""
        rows = await self.db_pool.select(
            "get_user_by_access_token",
            "SELECT t.user_id, t.device_id FROM access_tokens AS t"
            " JOIN users AS u ON u.name = t.user_id"
            " WHERE t.token_hash = ? AND NOT u.deactivated",
            token_hash,
        )
        return (rows[0][0], rows[0][1]) if rows else None

    async def delete_access_token(self, token_hash: str) -> None:
        """Revoke a token here and, through the caches stream, everywhere."""

        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute("DELETE FROM access_tokens WHERE token_hash = ?", (token_hash,))
            self.send_invalidation_txn(txn, "get_user_by_access_token", [token_hash])
            txn.call_after(self.get_user_by_access_token.invalidate, token_hash)

        await self.db_pool.runInteraction("delete_access_token", txn_func)
