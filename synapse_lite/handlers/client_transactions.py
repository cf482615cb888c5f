"""The main process's loop forgetting client transaction ids older than a day
(``client_transactions``; why they are kept at all is in
``storage/databases/main/client_transactions.py``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from synapse_lite.clock import Clock, PeriodicTask
from synapse_lite.storage.databases.main.client_transactions import (
    CLIENT_TXN_LIFETIME_MS,
    prune_client_transactions_txn,
)

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Seconds between prunes.
PRUNE_INTERVAL_SECONDS = 600.0
#: Ids deleted per transaction (a prune runs as many as it takes).
PRUNE_BATCH = 1000


class ClientTransactionExpiry(PeriodicTask):
    """Every :data:`PRUNE_INTERVAL_SECONDS`, deletes the client transaction
    ids recorded more than :data:`CLIENT_TXN_LIFETIME_MS` ago."""

    def __init__(self, store: GenericWorkerStore, clock: Clock) -> None:
        super().__init__(clock, PRUNE_INTERVAL_SECONDS, self.prune_expired)
        self._store = store

    async def prune_expired(self) -> int:
        """Delete the ids older than a day now; how many were. Never raises:
        the loop must go on after a failure (logged; the ids wait for the
        next prune)."""
        before = self._clock.time_msec() - CLIENT_TXN_LIFETIME_MS
        total = 0
        try:
            while True:
                deleted = await self._store.db_pool.runInteraction(
                    "prune_client_transactions", prune_client_transactions_txn, before, PRUNE_BATCH
                )
                total += deleted
                if deleted < PRUNE_BATCH:
                    break
        except Exception:
            logger.exception("Pruning client transaction ids failed")
        if total:
            logger.info("Forgot %d client transaction ids older than a day", total)
        return total
