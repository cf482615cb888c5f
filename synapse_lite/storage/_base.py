"""The base of every store mixin."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from synapse_lite.storage.caches import BoundCache
from synapse_lite.storage.database import DatabasePool, LoggingDatabaseConnection
from synapse_lite.storage.stream_ids import StreamIdSpace
from synapse_lite.storage.util.id_generators import MultiWriterIdGenerator

if TYPE_CHECKING:
    from synapse_lite.server import HomeServer

logger = logging.getLogger(__name__)


def db_to_json(value: str | bytes | None) -> Any:
    """Decode a JSON column."""
    if value is None:
        return None
    if isinstance(value, (bytes, memoryview)):
        value = bytes(value).decode("utf-8")
    return json.loads(value)


def json_encoder(value: Any) -> str:
    """Encode a value for a JSON column (compact, stable key order)."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def page_of_updates(
    updates: list[tuple[int, Any]], limit: int, current_id: int
) -> tuple[list[tuple[int, Any]], int, bool]:
    """An update function's answer from rows read with ``LIMIT limit``, one row
    per id: a full page reaches only as far as its last row (the caller asks
    again from there); otherwise it covers everything up to ``current_id``."""
    if len(updates) >= limit:
        return updates, updates[-1][0], True
    return updates, current_id, False


class SQLBaseStore:
    """Every store mixin takes ``(database, db_conn, hs)`` and calls
    ``super().__init__(database, db_conn, hs)``, so any combination of mixins
    composes. ``db_conn`` is the startup connection: a mixin may read from it
    in ``__init__`` (its ID generators do) and must not keep it.
    """

    def __init__(self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: HomeServer):
        self.hs = hs
        self.db_pool = database
        self.database_engine = database.engine
        self.clock = hs.clock
        self.server_name = hs.hostname
        self._instance_name = hs.instance_name

    def build_id_generator(
        self, db_conn: LoggingDatabaseConnection, space: StreamIdSpace
    ) -> MultiWriterIdGenerator:
        """The ID generator of one stream, loaded now from the startup connection."""
        return MultiWriterIdGenerator(
            db_conn=db_conn,
            db=self.db_pool,
            notifier=self.hs.replication_notifier,
            stream_name=space.stream_name,
            instance_name=self._instance_name,
            tables=space.id_generator_tables(),
            sequence_name=space.sequence_name,
            writers=space.writers(self.hs.config.stream_writers),
            positive=space.positive,
            prune_removed_writers=self.hs.is_main_process,
            position_log=self.hs.position_log,
        )

    # Replication hooks: each mixin handles its own streams, then calls super().

    def process_replication_rows(
        self, stream_name: str, instance_name: str, token: int, rows: Iterable[Any]
    ) -> None:
        """Invalidate caches for rows another process wrote. Runs before the
        stream's position advances."""

    def process_replication_position(
        self, stream_name: str, instance_name: str, token: int
    ) -> None:
        """Advance this store's view of a writer of a stream."""

    # Caches

    def get_cache(self, name: str) -> BoundCache[Any] | None:
        """The cache of the store method ``name``, if it is a cached method."""
        cache = getattr(self, name, None)
        return cache if isinstance(cache, BoundCache) else None

    def invalidate_cache_by_name(self, name: str, keys: list[Any] | None) -> None:
        """Invalidate one entry (``keys`` are the method's arguments) or, with
        ``keys=None``, the whole cache of a cached method."""
        cache = self.get_cache(name)
        if cache is None:
            logger.debug("No cache called %s to invalidate", name)
            return
        if keys is None:
            cache.invalidate_all()
        else:
            cache.invalidate(tuple(keys) if len(keys) != 1 else keys[0])
