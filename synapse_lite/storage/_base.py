"""The base of every store mixin."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attr

from synapse_lite.api.identifiers import is_mine_id
from synapse_lite.config.homeserver import HomeServerConfig
from synapse_lite.federation.crypto import compact_sorted_json
from synapse_lite.storage.caches import BoundCache
from synapse_lite.storage.change_tracker import PositionChangeTracker
from synapse_lite.storage.database import DatabasePool, LoggingDatabaseConnection

if TYPE_CHECKING:
    from synapse_lite.clock import Clock
    from synapse_lite.storage.stream_ids import StreamIdGenerators

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
    return compact_sorted_json(value)


def page_of_updates(
    updates: list[tuple[int, Any]], limit: int, current_id: int
) -> tuple[list[tuple[int, Any]], int, bool]:
    """An update function's answer from rows read with ``LIMIT limit``, one row
    per id: a full page reaches only as far as its last row (the caller asks
    again from there); otherwise it covers everything up to ``current_id``."""
    if len(updates) >= limit:
        return updates, updates[-1][0], True
    return updates, current_id, False


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StoreContext:
    """What a store knows of its process: the ``hs`` of the stores'
    ``(database, db_conn, hs)`` constructors. Deliberately small: a store reads
    and writes tables; it does not reach other components."""

    config: HomeServerConfig
    clock: Clock
    instance_name: str
    id_generators: StreamIdGenerators

    @property
    def server_name(self) -> str:
        return self.config.server_name

    def is_mine_id(self, user_id: str) -> bool:
        """Whether a user id belongs to this server."""
        return is_mine_id(user_id, self.config.server_name)


class SQLBaseStore:
    """Every store mixin takes ``(database, db_conn, hs)`` and calls
    ``super().__init__(database, db_conn, hs)``, so any combination of mixins
    composes. ``db_conn`` is the startup connection: a mixin may read from it
    in ``__init__`` and must not keep it. ``hs`` is the :class:`StoreContext`;
    a mixin takes its streams' ID generators from ``hs.id_generators``.
    """

    def __init__(
        self, database: DatabasePool, db_conn: LoggingDatabaseConnection, hs: StoreContext
    ):
        self.hs = hs
        self.db_pool = database
        self.database_engine = database.engine
        self.clock = hs.clock
        self.server_name = hs.server_name
        self._instance_name = hs.instance_name
        #: Stream name -> its change tracker (streams declaring ``changed_entity``).
        self.stream_changes: dict[str, PositionChangeTracker] = {}

    # Caches

    def track_stream_changes(
        self, stream_name: str, current_position: Callable[[], int]
    ) -> PositionChangeTracker:
        """A change tracker for ``stream_name`` (see ``storage/change_tracker.py``),
        from ``current_position()`` (the stream's persisted-up-to position) on.
        Its rows from other writers are recorded by the replication receiver;
        the store's own writes record theirs (``record_after_commit``)."""
        tracker = PositionChangeTracker(current_position)
        self.stream_changes[stream_name] = tracker
        return tracker

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
