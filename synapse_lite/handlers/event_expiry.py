"""Self-destructing events (MSC2228, an unstable proposal; off unless
``experimental_features.msc2228_self_destructing_events`` is on).

An event sent while the feature is on whose content has an integer
``org.matrix.self_destruct_after`` (ms since the epoch) is recorded, by its
writer in the transaction that persists it, in ``event_expiry``. The main
process looks for due events every second and prunes each one's stored
content as a redaction would (no redaction event is sent), then every
process's event cache forgets it (caches stream): from then on every read
serves the pruned event.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from synapse_lite.clock import Clock, PeriodicTask

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: Seconds between looks for due events.
CHECK_INTERVAL_SECONDS = 1.0
#: Events pruned per look (more wait for the next one).
BATCH = 100


class EventExpiry(PeriodicTask):
    """The main process's loop pruning events whose time has come."""

    def __init__(self, store: GenericWorkerStore, clock: Clock) -> None:
        super().__init__(clock, CHECK_INTERVAL_SECONDS, self.expire_due)
        self._store = store

    async def expire_due(self) -> int:
        """Prune the events due now; how many were. Never raises: the loop
        must go on after a failure (logged; the events stay due)."""
        try:
            due = await self._store.get_events_due_to_expire(self._clock.time_msec(), BATCH)
            for event_id in due:
                await self._store.expire_event(event_id)
            if due:
                logger.info("Pruned %d self-destructing events", len(due))
            return len(due)
        except Exception:
            logger.exception("Pruning self-destructing events failed")
            return 0
