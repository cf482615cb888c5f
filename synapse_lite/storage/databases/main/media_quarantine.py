"""Quarantine and protection of local media (``local_media.quarantined_by``,
``safe_from_quarantine``: delta 0065), set by the admin API from any process.
Whether a media is quarantined is read on every download, so it is cached
per media id in each process and invalidated, here and through the caches
stream everywhere (the media instance too), when an admin changes it."""

from __future__ import annotations

from synapse_lite.storage.caches import cached
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.cache import CacheInvalidationWorkerStore


class MediaQuarantineWorkerStore(CacheInvalidationWorkerStore):
    @cached(max_entries=100_000)
    async def is_media_quarantined(self, media_id: str) -> bool:
        rows = await self.db_pool.select(
            "is_media_quarantined",
            "SELECT quarantined_by FROM local_media WHERE media_id = ?",
            media_id,
        )
        return bool(rows) and rows[0][0] is not None

    async def quarantine_media(
        self, media_ids: list[str], by: str | None, spare_protected: bool
    ) -> int:
        """Quarantine ``media_ids`` (``by``: the admin) or release them (None);
        with ``spare_protected`` the protected ones are left alone. How many
        changed."""

        def txn_func(txn: LoggingTransaction) -> int:
            changed = 0
            for media_id in media_ids:
                protected = " AND NOT safe_from_quarantine" if spare_protected else ""
                if by is None:
                    txn.execute(
                        "UPDATE local_media SET quarantined_by = NULL"
                        " WHERE media_id = ? AND quarantined_by IS NOT NULL",
                        (media_id,),
                    )
                else:
                    txn.execute(
                        "UPDATE local_media SET quarantined_by = ?"
                        f" WHERE media_id = ? AND quarantined_by IS NULL{protected}",
                        (by, media_id),
                    )
                if txn.rowcount > 0:
                    changed += 1
                    self.send_invalidation_txn(txn, "is_media_quarantined", [media_id])
                    txn.call_after(self.is_media_quarantined.invalidate, media_id)
            return changed

        return await self.db_pool.runInteraction("quarantine_media", txn_func)

    async def set_media_protected(self, media_id: str, protected: bool) -> bool:
        """Whether there is such a media."""

        def txn_func(txn: LoggingTransaction) -> bool:
            txn.execute(
                "UPDATE local_media SET safe_from_quarantine = ? WHERE media_id = ?",
                (protected, media_id),
            )
            return txn.rowcount > 0

        return await self.db_pool.runInteraction("set_media_protected", txn_func)

    async def get_media_ids_of_user(self, user_id: str) -> list[str]:
        rows = await self.db_pool.select(
            "get_media_ids_of_user",
            "SELECT media_id FROM local_media WHERE user_id = ? ORDER BY media_id",
            user_id,
        )
        return [str(r[0]) for r in rows]

    async def get_existing_media_ids(self, media_ids: list[str]) -> list[str]:
        """Those of ``media_ids`` this server has."""
        found: list[str] = []
        for start in range(0, len(media_ids), 500):
            chunk = media_ids[start : start + 500]
            marks = ", ".join("?" for _ in chunk)
            rows = await self.db_pool.select(
                "get_existing_media_ids",
                f"SELECT media_id FROM local_media WHERE media_id IN ({marks})",
                *chunk,
            )
            found.extend(str(r[0]) for r in rows)
        return sorted(found)
