"""Registration tokens (``registration_tokens``): created, listed, changed
and deleted by admins; a use reserved by a registration that presents one
and, when the user exists, completed (or released when registration fails).

A plain table no stream owns: any process writes it. Every change is one
statement, so two registrations racing for a token's last use cannot both
get it.
"""

from __future__ import annotations

from typing import Any

import attr

from synapse_lite.storage._base import SQLBaseStore
from synapse_lite.storage.database import LoggingTransaction

_COLUMNS = "token, uses_allowed, pending, completed, expiry_time"

#: A token may be used at ``now`` (the statement's one argument): unexpired
#: and with a use left once the reservations under way are counted.
_USABLE = (
    "(expiry_time IS NULL OR expiry_time >= ?)"
    " AND (uses_allowed IS NULL OR pending + completed < uses_allowed)"
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class RegistrationToken:
    """A token as the admin API shows it."""

    token: str
    uses_allowed: int | None
    pending: int
    completed: int
    expiry_time: int | None

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> RegistrationToken:
        token, uses_allowed, pending, completed, expiry_time = row
        return cls(
            token=token,
            uses_allowed=None if uses_allowed is None else int(uses_allowed),
            pending=int(pending),
            completed=int(completed),
            expiry_time=None if expiry_time is None else int(expiry_time),
        )

    def is_valid(self, now_ms: int) -> bool:
        """Whether a registration may use it now (as :data:`_USABLE` says)."""
        if self.expiry_time is not None and self.expiry_time < now_ms:
            return False
        return self.uses_allowed is None or self.pending + self.completed < self.uses_allowed

    def to_json(self) -> dict[str, Any]:
        return attr.asdict(self)


class RegistrationTokensWorkerStore(SQLBaseStore):
    """The ``registration_tokens`` table."""

    async def list_registration_tokens(self) -> list[RegistrationToken]:
        """Every token, in the order of their names."""
        rows = await self.db_pool.select(
            "list_registration_tokens", f"SELECT {_COLUMNS} FROM registration_tokens ORDER BY token"
        )
        return [RegistrationToken.from_row(r) for r in rows]

    async def get_registration_token(self, token: str) -> RegistrationToken | None:
        rows = await self.db_pool.select(
            "get_registration_token",
            f"SELECT {_COLUMNS} FROM registration_tokens WHERE token = ?",
            token,
        )
        return RegistrationToken.from_row(rows[0]) if rows else None

    async def create_registration_token(
        self, token: str, uses_allowed: int | None, expiry_time: int | None
    ) -> bool:
        """Create an unused token; False if one of that name exists."""

        def txn_func(txn: LoggingTransaction) -> bool:
            txn.execute(
                "INSERT INTO registration_tokens"
                " (token, uses_allowed, pending, completed, expiry_time)"
                " VALUES (?, ?, 0, 0, ?) ON CONFLICT (token) DO NOTHING",
                (token, uses_allowed, expiry_time),
            )
            return txn.rowcount > 0

        return await self.db_pool.runInteraction("create_registration_token", txn_func)

    async def update_registration_token(
        self, token: str, changes: dict[str, int | None]
    ) -> RegistrationToken | None:
        """Set ``changes`` (``uses_allowed`` and/or ``expiry_time``); the token
        as it is then, or None if there is no such token."""
        assert set(changes) <= {"uses_allowed", "expiry_time"}, changes

        def txn_func(txn: LoggingTransaction) -> RegistrationToken | None:
            if changes:
                sets = ", ".join(f"{column} = ?" for column in sorted(changes))
                txn.execute(
                    f"UPDATE registration_tokens SET {sets} WHERE token = ?",
                    [changes[c] for c in sorted(changes)] + [token],
                )
            txn.execute(f"SELECT {_COLUMNS} FROM registration_tokens WHERE token = ?", (token,))
            row = txn.fetchone()
            return RegistrationToken.from_row(tuple(row)) if row is not None else None

        return await self.db_pool.runInteraction("update_registration_token", txn_func)

    async def delete_registration_token(self, token: str) -> bool:
        """Whether there was such a token."""

        def txn_func(txn: LoggingTransaction) -> bool:
            txn.execute("DELETE FROM registration_tokens WHERE token = ?", (token,))
            return txn.rowcount > 0

        return await self.db_pool.runInteraction("delete_registration_token", txn_func)

    async def reserve_registration_token(self, token: str, now_ms: int) -> bool:
        """Reserve a use of ``token`` (``pending`` + 1) if it is valid at
        ``now_ms``; False if it is unknown, expired or used up. The caller
        ends the reservation with :meth:`end_registration_token_use`."""

        def txn_func(txn: LoggingTransaction) -> bool:
            txn.execute(
                "UPDATE registration_tokens SET pending = pending + 1"
                f" WHERE token = ? AND {_USABLE}",
                (token, now_ms),
            )
            return txn.rowcount > 0

        return await self.db_pool.runInteraction("reserve_registration_token", txn_func)

    async def end_registration_token_use(self, token: str, completed: bool) -> None:
        """End a reservation: the use is ``completed`` (a user registered) or
        given back. A token deleted meanwhile is left deleted."""
        await self.db_pool.execute(
            "end_registration_token_use",
            "UPDATE registration_tokens SET pending = pending - 1, completed = completed + ?"
            " WHERE token = ? AND pending > 0",
            1 if completed else 0,
            token,
        )
