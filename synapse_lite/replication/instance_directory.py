"""Where the other processes are and which of them write events, kept current
while this process runs.

A process reads its config once, when it starts; processes started before an
events writer was added or retired learn of the change here, from the
``instances`` table:

* every process records itself there as it starts (its internal HTTP address,
  whether it writes events); the main process also makes the table agree with
  its own config;
* events from a writer this process does not know make it read the table again
  (a writer added since it started);
* the main process retires a writer (``retire_events_writer``) by updating the
  table and announcing it on the caches stream: each process reads the table
  again, reads the rest of the retired writer's rows, and stops tracking it;
* a process that cannot connect to another reads the table again and retries
  at the address the other recorded, if it differs from the config's (the
  other may have restarted on another port).

See docs/workers.md, "Adding and removing events writers".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from synapse_lite.config.homeserver import MAIN_PROCESS, HomeServerConfig, InstanceLocation
from synapse_lite.storage.database import LoggingTransaction
from synapse_lite.storage.databases.main.instances import (
    INSTANCES_CACHE_NAME,
    InstanceRecord,
    InstancesWorkerStore,
)

if TYPE_CHECKING:
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)


class InstanceDirectory:
    """This process's running view of ``instances`` over its config."""

    def __init__(
        self, config: HomeServerConfig, instance_name: str, store: GenericWorkerStore
    ) -> None:
        self._config = config
        self._me = instance_name
        self._store = store
        self._records: dict[str, InstanceRecord] = {}
        self._event_writers: tuple[str, ...] = self._config.writers.writers("events")
        #: Writers retired before this process started that its config still lists.
        self._retired_at_startup: list[str] = []
        #: Writers the main process's config dropped since its last run.
        self._dropped_by_config: list[str] = []
        #: Unknown writers already looked up since the table last changed, so a
        #: writer the table does not list is not looked up on every row.
        self._looked_up: set[str] = set()
        self._refresh_lock = defer.DeferredLock()
        #: Told of each writer retired (the command handler, once built).
        self._forget: Callable[[str], None] | None = None
        #: The deployment this database belongs to (read at startup).
        self.deployment_id = ""

    # Startup

    def load_at_startup(self, txn: LoggingTransaction) -> None:
        """Record this process and read the table (on the startup connection)."""
        me = self._me
        writers = self._config.writers.writers("events")
        self.deployment_id = InstancesWorkerStore.load_or_create_deployment_id_txn(txn)
        InstancesWorkerStore.record_instance_txn(
            txn, me, self._config.instance_map.get(me), me in writers
        )
        if me == MAIN_PROCESS:
            self._dropped_by_config = InstancesWorkerStore.reconcile_events_writers_txn(
                txn, writers, self._config.instance_map
            )
        self._apply(InstancesWorkerStore.get_instances_txn(txn))
        self._retired_at_startup = [w for w in writers if w not in self._event_writers]
        for writer in self._retired_at_startup:
            logger.warning(
                "The config lists %s as an events writer, but it was retired; remove it from"
                " stream_writers.events",
                writer,
            )

    def follow_retirements(self, forget: Callable[[str], None]) -> None:
        """Call ``forget(writer)`` for each events writer retired: at once for
        those retired before this process started that its config still
        lists, later as the table changes. The main process also announces
        the writers its config dropped, for processes still running with the
        old config. (Called by the command handler as it is built; the
        table's changes arrive through :meth:`on_events_rows` and
        :meth:`on_caches_rows`, row hooks of the receiver.)"""
        self._forget = forget
        for writer in self._retired_at_startup:
            self._forget_writer(writer)
        if self._dropped_by_config:
            # Processes still running with the old config must hear of it.
            logger.info("No longer events writers: %s", ", ".join(self._dropped_by_config))
            d = defer.ensureDeferred(
                self._store.announce_instances_changed(self._dropped_by_config)
            )
            d.addErrback(lambda f: logger.warning("Announcing retired writers failed: %s", f))

    # Reading

    def event_writers(self) -> tuple[str, ...]:
        """The processes that write events now (new rooms go to one of them)."""
        return self._event_writers

    def is_known(self, instance_name: str) -> bool:
        """Whether the config or the table knows a process of this name."""
        return instance_name in self._records or instance_name in self._config.instance_names()

    def locations_of(self, instance_name: str) -> list[InstanceLocation]:
        """Where ``instance_name`` may answer internal HTTP requests, best
        first: as the config says, then as it recorded at its last start (a
        process added, or moved to another port, since this one started).
        ``KeyError`` if neither knows."""
        found = []
        if instance_name in self._config.instance_map:
            found.append(self._config.instance_map[instance_name])
        record = self._records.get(instance_name)
        if record is not None and record.location is not None and record.location not in found:
            found.append(record.location)
        if not found:
            raise KeyError(
                f"{instance_name!r} has no listener with the 'replication' resource in the"
                " config, and has not recorded one in the instances table"
            )
        return found

    # Changes

    async def refresh(self) -> None:
        """Read the table again and act on what changed."""
        async with self._refresh_lock:
            records = await self._store.get_instances()
            for writer in self._apply(records):
                self._forget_writer(writer)

    def _apply(self, records: list[InstanceRecord]) -> list[str]:
        """Take a new copy of the table; returns the events writers it removed."""
        self._records = {r.instance_name: r for r in records}
        writers = list(self._config.writers.writers("events"))
        for record in records:
            name = record.instance_name
            if record.writes_events and name not in writers:
                writers.append(name)
            elif not record.writes_events and name in writers:
                writers.remove(name)
        if not writers:
            logger.error("The instances table lists no events writer; using the config's")
            writers = list(self._config.writers.writers("events"))
        previous = self._event_writers
        self._event_writers = tuple(writers)
        added = [w for w in writers if w not in previous]
        removed = [w for w in previous if w not in writers]
        if added or removed:
            logger.info(
                "Events writers are now %s (added: %s; removed: %s)",
                ", ".join(writers),
                ", ".join(added) or "none",
                ", ".join(removed) or "none",
            )
        return removed

    def _forget_writer(self, writer: str) -> None:
        if self._forget is None or writer == self._me:
            return
        self._forget(writer)

    def _refresh_in_background(self, why: str) -> None:
        logger.info("Reading the instances table again: %s", why)
        d = defer.ensureDeferred(self.refresh())
        d.addErrback(lambda f: logger.warning("Reading the instances table failed: %s", f.value))

    def on_events_rows(self, instance_name: str, token: int, rows: Sequence[Any]) -> None:
        if instance_name in self._event_writers or instance_name in self._looked_up:
            return
        self._looked_up.add(instance_name)
        self._refresh_in_background(f"events from {instance_name}, not known as an events writer")

    def on_caches_rows(self, instance_name: str, token: int, rows: Sequence[Any]) -> None:
        changed = [r for r in rows if r.cache_func == INSTANCES_CACHE_NAME]
        if changed:
            self._looked_up.clear()
            names = ", ".join(str(k) for r in changed for k in (r.keys or []))
            self._refresh_in_background(f"{instance_name} changed {names or 'it'}")
