"""Users, their access tokens (stored as SHA-256 hashes only) and
user-interactive auth sessions."""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.storage._base import db_to_json, json_encoder
from synapse_lite.storage.caches import cached
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.cache import CacheInvalidationWorkerStore
from synapse_lite.storage.databases.main.devices import DeviceWorkerStore


class UserExistsError(Exception):
    """The user id is taken."""


@attr.s(slots=True, frozen=True, auto_attribs=True)
class UiAuthSession:
    """A user-interactive auth session (a row of ``ui_auth_sessions``)."""

    session_id: str
    #: What the session may authorise, as the handler that began it named it.
    operation: str
    completed_stages: tuple[str, ...]
    #: Parameters of the first request that later rounds may leave out.
    params: dict[str, Any] | None
    #: What the completed operation produced (None: not completed yet).
    result: dict[str, Any] | None


class RegistrationWorkerStore(DeviceWorkerStore, CacheInvalidationWorkerStore):
    """Users, devices' access tokens, and looking a token up on every request."""

    async def register_user(
        self, user_id: str, password_hash: str | None, admin: bool = False, guest: bool = False
    ) -> None:
        """Create a user (a guest account with ``guest``); raises
        :class:`UserExistsError` if the id is taken."""

        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute(
                "INSERT INTO users (name, password_hash, creation_ts, admin, is_guest)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING",
                (user_id, password_hash, self.clock.time_msec(), admin, guest),
            )
            if txn.rowcount == 0:
                raise UserExistsError(user_id)

        await self.db_pool.runInteraction("register_user", txn_func)

    async def upgrade_guest(self, user_id: str, password_hash: str | None) -> bool:
        """Make a guest account a full one with this password, keeping its id;
        False if ``user_id`` is not a guest (any more). Every process forgets
        its cached token lookups of the user, which carry the guest flag."""

        def txn_func(txn: LoggingTransaction) -> bool:
            txn.execute(
                "UPDATE users SET is_guest = FALSE, password_hash = ?"
                " WHERE name = ? AND is_guest AND NOT deactivated",
                (password_hash, user_id),
            )
            if txn.rowcount == 0:
                return False
            txn.execute("SELECT token_hash FROM access_tokens WHERE user_id = ?", (user_id,))
            for (token_hash,) in txn.fetchall():
                self.send_invalidation_txn(txn, "get_user_by_access_token", [token_hash])
                txn.call_after(self.get_user_by_access_token.invalidate, token_hash)
            return True

        return await self.db_pool.runInteraction("upgrade_guest", txn_func)

    async def get_user(self, user_id: str) -> dict[str, Any] | None:
        rows = await self.db_pool.select(
            "get_user",
            "SELECT name, password_hash, creation_ts, admin, deactivated, is_guest"
            " FROM users WHERE name = ?",
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
            "is_guest": bool(r[5]),
        }

    async def get_guests_among(self, user_ids: list[str]) -> frozenset[str]:
        """Which of ``user_ids`` are guest accounts (one query)."""
        if not user_ids:
            return frozenset()
        placeholders = ", ".join("?" for _ in user_ids)
        rows = await self.db_pool.select(
            "get_guests_among",
            f"SELECT name FROM users WHERE is_guest AND name IN ({placeholders})",
            *user_ids,
        )
        return frozenset(r[0] for r in rows)

    async def get_guests_in_room(self, room_id: str) -> list[str]:
        """The guest accounts joined to a room now, in user id order."""
        rows = await self.db_pool.select(
            "get_guests_in_room",
            "SELECT c.state_key FROM current_state_events AS c"
            " JOIN users AS u ON u.name = c.state_key"
            " WHERE c.room_id = ? AND c.type = 'm.room.member' AND c.membership = 'join'"
            " AND u.is_guest ORDER BY c.state_key",
            room_id,
        )
        return [r[0] for r in rows]

    async def set_password_hash(self, user_id: str, password_hash: str) -> None:
        """Replace a user's password (any process: ``users`` is no stream's)."""
        await self.db_pool.execute(
            "set_password_hash",
            "UPDATE users SET password_hash = ? WHERE name = ?",
            password_hash,
            user_id,
        )

    async def deactivate_user(self, user_id: str, erased_at_position: int | None = None) -> None:
        """Mark a user deactivated and forget their password. The row stays,
        so the name is never registered again; their tokens stop working at
        once (the token lookup joins on ``NOT deactivated``), though the
        caller still deletes them with the devices. ``erased_at_position``:
        the user asked for erasure, as of that events stream position."""

        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute(
                "UPDATE users SET deactivated = TRUE, password_hash = NULL,"
                " erased_at_position = COALESCE(erased_at_position, ?) WHERE name = ?",
                (erased_at_position, user_id),
            )
            if erased_at_position is not None:
                self.send_invalidation_txn(txn, "get_erasure_position", [user_id])
                txn.call_after(self.get_erasure_position.invalidate, user_id)

        await self.db_pool.runInteraction("deactivate_user", txn_func)

    @cached(max_entries=100_000)
    async def get_erasure_position(self, user_id: str) -> int | None:
        """Where in the events stream ``user_id`` was erased (None: never)."""
        rows = await self.db_pool.select(
            "get_erasure_position",
            "SELECT erased_at_position FROM users WHERE name = ?",
            user_id,
        )
        return None if not rows or rows[0][0] is None else int(rows[0][0])

    @cached(max_entries=100_000)
    async def get_user_by_access_token(
        self, token_hash: str
    ) -> tuple[str, str, bool, int | None] | None:
        """``(user_id, device_id, is_guest, valid_until_ms)`` owning a token,
        or None. ``valid_until_ms`` (None: no end) is for the caller to
        check: the answer is cached past it."""
        rows = await self.db_pool.select(
            "get_user_by_access_token",
            "SELECT t.user_id, t.device_id, u.is_guest, t.valid_until_ms FROM access_tokens AS t"
            " JOIN users AS u ON u.name = t.user_id"
            " WHERE t.token_hash = ? AND NOT u.deactivated",
            token_hash,
        )
        if not rows:
            return None
        user_id, device_id, is_guest, valid_until_ms = rows[0]
        return (
            user_id,
            device_id,
            bool(is_guest),
            None if valid_until_ms is None else int(valid_until_ms),
        )

    async def add_access_token(
        self, token_hash: str, user_id: str, device_id: str, valid_until_ms: int | None
    ) -> None:
        """A token for ``device_id`` with no row in ``devices`` (so no device
        list change and any process may add it): an admin's token to act as
        the user. Logging it out deletes it as any device's tokens."""
        await self.db_pool.execute(
            "add_access_token",
            "INSERT INTO access_tokens (token_hash, user_id, device_id, created_ts, valid_until_ms)"
            " VALUES (?, ?, ?, ?, ?)",
            token_hash,
            user_id,
            device_id,
            self.clock.time_msec(),
            valid_until_ms,
        )

    async def replace_access_tokens(
        self, user_id: str, device_id: str, token_hash: str, device_display_name: str | None
    ) -> bool:
        """Log a device in again: its old tokens stop working (here and,
        through the caches stream, everywhere) and ``token_hash`` is its new
        one. Returns whether the device is new. On the user's device_lists
        writer only."""

        def txn_func(txn: LoggingTransaction) -> bool:
            txn.execute(
                "SELECT token_hash FROM access_tokens WHERE user_id = ? AND device_id = ?",
                (user_id, device_id),
            )
            for (old_hash,) in txn.fetchall():
                self.send_invalidation_txn(txn, "get_user_by_access_token", [old_hash])
                txn.call_after(self.get_user_by_access_token.invalidate, old_hash)
            txn.execute(
                "DELETE FROM access_tokens WHERE user_id = ? AND device_id = ?",
                (user_id, device_id),
            )
            new_device = self.store_device_txn(txn, user_id, device_id, device_display_name)
            txn.execute(
                "INSERT INTO access_tokens (token_hash, user_id, device_id, created_ts)"
                " VALUES (?, ?, ?, ?)",
                (token_hash, user_id, device_id, self.clock.time_msec()),
            )
            return new_device

        return await self.db_pool.runInteraction("replace_access_tokens", txn_func)

    async def delete_devices(
        self, user_id: str, device_ids: list[str] | None
    ) -> tuple[list[str], list[str]]:
        """Log devices out: delete them (every device of the user when None)
        with all their access tokens, here and, through the caches stream,
        everywhere. On the user's device_lists writer only. Returns the devices
        deleted and the hashes of the tokens revoked."""

        def txn_func(txn: LoggingTransaction) -> tuple[list[str], list[str]]:
            if device_ids is None:
                txn.execute("SELECT device_id FROM devices WHERE user_id = ?", (user_id,))
                targets = [r[0] for r in txn.fetchall()]
            else:
                targets = list(device_ids)
            hashes: list[str] = []
            deleted: list[str] = []
            for device_id in targets:
                txn.execute(
                    "SELECT token_hash FROM access_tokens WHERE user_id = ? AND device_id = ?",
                    (user_id, device_id),
                )
                hashes.extend(r[0] for r in txn.fetchall())
                txn.execute(
                    "DELETE FROM access_tokens WHERE user_id = ? AND device_id = ?",
                    (user_id, device_id),
                )
                if self.delete_device_txn(txn, user_id, device_id):
                    deleted.append(device_id)
            for token_hash in hashes:
                self.send_invalidation_txn(txn, "get_user_by_access_token", [token_hash])
                txn.call_after(self.get_user_by_access_token.invalidate, token_hash)
            return deleted, hashes

        return await self.db_pool.runInteraction("delete_devices", txn_func)

    # User-interactive auth sessions (shared by every process through the table)

    async def create_ui_auth_session(
        self, session_id: str, operation: str, params: dict[str, Any] | None
    ) -> None:
        """A new session for ``operation``, remembering ``params`` (see
        :class:`UiAuthSession`)."""
        await self.db_pool.execute(
            "create_ui_auth_session",
            "INSERT INTO ui_auth_sessions"
            " (session_id, creation_ts, completed_stages, operation, params)"
            " VALUES (?, ?, ?, ?, ?)",
            session_id,
            self.clock.time_msec(),
            json_encoder([]),
            operation,
            None if params is None else json_encoder(params),
        )

    async def get_ui_auth_session(self, session_id: str) -> UiAuthSession | None:
        """The session, or None if there is no such session."""
        rows = await self.db_pool.select(
            "get_ui_auth_session",
            "SELECT completed_stages, operation, params, result FROM ui_auth_sessions"
            " WHERE session_id = ?",
            session_id,
        )
        if not rows:
            return None
        stages, operation, params, result = rows[0]
        return UiAuthSession(
            session_id=session_id,
            operation=operation,
            completed_stages=tuple(db_to_json(stages)),
            params=None if params is None else db_to_json(params),
            result=None if result is None else db_to_json(result),
        )

    async def set_ui_auth_session_result(self, session_id: str, result: dict[str, Any]) -> None:
        """Record what the session's completed operation produced."""
        await self.db_pool.execute(
            "set_ui_auth_session_result",
            "UPDATE ui_auth_sessions SET result = ? WHERE session_id = ?",
            json_encoder(result),
            session_id,
        )

    async def delete_old_ui_auth_sessions(self, older_than_ms: int) -> None:
        await self.db_pool.execute(
            "delete_old_ui_auth_sessions",
            "DELETE FROM ui_auth_sessions WHERE creation_ts < ?",
            older_than_ms,
        )
