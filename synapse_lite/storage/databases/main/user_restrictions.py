"""What admins restrict a user with: a shadow ban (``users.shadow_banned``),
a suspension (``users.suspended``) and a message rate limit of their own
(``ratelimit_override``). Read on every authenticated request, so cached
per user in each process; a change (any process may make one: no stream
owns these rows) invalidates the cache here and, through the caches
stream, everywhere."""

from __future__ import annotations

import attr

from synapse_lite.config.homeserver import RateLimitConfig
from synapse_lite.storage.caches import cached
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.cache import CacheInvalidationWorkerStore


@attr.s(slots=True, frozen=True, auto_attribs=True)
class UserRestrictions:
    shadow_banned: bool
    suspended: bool
    #: The user's message rate limit, None for the configured one.
    ratelimit_override: RateLimitConfig | None


NO_RESTRICTIONS = UserRestrictions(shadow_banned=False, suspended=False, ratelimit_override=None)


class UserRestrictionsWorkerStore(CacheInvalidationWorkerStore):
    @cached(max_entries=100_000)
    async def get_user_restrictions(self, user_id: str) -> UserRestrictions:
        rows = await self.db_pool.select(
            "get_user_restrictions",
            "SELECT u.shadow_banned, u.suspended, o.messages_per_second, o.burst_count"
            " FROM users AS u"
            " LEFT JOIN ratelimit_override AS o ON o.user_id = u.name WHERE u.name = ?",
            user_id,
        )
        if not rows:
            return NO_RESTRICTIONS
        banned, suspended, per_second, burst = rows[0]
        override = (
            None
            if per_second is None
            else RateLimitConfig(per_second=float(per_second), burst=int(burst))
        )
        return UserRestrictions(
            shadow_banned=bool(banned), suspended=bool(suspended), ratelimit_override=override
        )

    def _restrictions_changed_txn(self, txn: LoggingTransaction, user_id: str) -> None:
        self.send_invalidation_txn(txn, "get_user_restrictions", [user_id])
        txn.call_after(self.get_user_restrictions.invalidate, user_id)

    async def set_shadow_banned(self, user_id: str, banned: bool) -> None:
        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute("UPDATE users SET shadow_banned = ? WHERE name = ?", (banned, user_id))
            self._restrictions_changed_txn(txn, user_id)

        await self.db_pool.runInteraction("set_shadow_banned", txn_func)

    async def set_suspended(self, user_id: str, suspended: bool) -> None:
        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute("UPDATE users SET suspended = ? WHERE name = ?", (suspended, user_id))
            self._restrictions_changed_txn(txn, user_id)

        await self.db_pool.runInteraction("set_suspended", txn_func)

    async def set_ratelimit_override(
        self, user_id: str, messages_per_second: int, burst_count: int
    ) -> None:
        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute(
                "INSERT INTO ratelimit_override (user_id, messages_per_second, burst_count)"
                " VALUES (?, ?, ?) ON CONFLICT (user_id) DO UPDATE SET"
                " messages_per_second = EXCLUDED.messages_per_second,"
                " burst_count = EXCLUDED.burst_count",
                (user_id, messages_per_second, burst_count),
            )
            self._restrictions_changed_txn(txn, user_id)

        await self.db_pool.runInteraction("set_ratelimit_override", txn_func)

    async def delete_ratelimit_override(self, user_id: str) -> None:
        def txn_func(txn: LoggingTransaction) -> None:
            txn.execute("DELETE FROM ratelimit_override WHERE user_id = ?", (user_id,))
            self._restrictions_changed_txn(txn, user_id)

        await self.db_pool.runInteraction("delete_ratelimit_override", txn_func)
