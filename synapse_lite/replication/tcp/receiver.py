"""Applying rows and positions that other processes wrote, in the order that
keeps readers safe, and waking whoever waits for them.

For each batch of rows (or a bare position) of one writer at one token:

1. the stream's definition says which caches go stale (``invalidate``), and
   its change tracker records the entities the rows change (``changed_entity``);
2. the role's handlers take their rows (typing follower, federation sender, ...);
3. the stream's position advances -- here and nowhere else;
4. the /sync waiters the definition names are woken;
5. callers waiting for that writer's position are released.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from synapse_lite.clock import Clock
from synapse_lite.replication.streams import Stream, StreamPositions

if TYPE_CHECKING:
    from synapse_lite.notifier import Notifier
    from synapse_lite.storage.databases.main import GenericWorkerStore

logger = logging.getLogger(__name__)

#: How long ``wait_for_stream_position`` waits before giving up.
WAIT_FOR_REPLICATION_TIMEOUT_SECONDS = 30.0

#: ``hook(writer, token, rows)``: rows empty for a bare position.
RowHook = Callable[[str, int, Sequence[Any]], None]


class PositionWaiters:
    """Callers waiting until this process has received a writer's rows up to a
    position (read-your-writes after a forwarded write, /sync tokens from a
    process further along).

    ``positions``: every stream's positions on this process, by stream name
    (built before the streams themselves, so the internal calls, which wait
    here, can be built before the components owning memory streams).
    ``reads``: the streams this process receives (its role's subscription;
    None: every stream); waiting on another returns at once, as nothing
    here reads it to be stale."""

    def __init__(
        self,
        clock: Clock,
        instance_name: str,
        positions: Mapping[str, StreamPositions],
        reads: Collection[str] | None = None,
    ) -> None:
        self._clock = clock
        self._me = instance_name
        self._positions = positions
        self._reads = None if reads is None else frozenset(reads)
        self._waiting: dict[tuple[str, str], list[tuple[int, defer.Deferred[None]]]] = defaultdict(
            list
        )

    async def wait_for_stream_position(
        self,
        instance_name: str,
        stream_name: str,
        position: int,
        timeout: float = WAIT_FOR_REPLICATION_TIMEOUT_SECONDS,
    ) -> None:
        """Return once ``instance_name``'s rows of ``stream_name`` up to
        ``position`` have been received here (at once if they have, or if it is
        this process). Raises ``defer.TimeoutError`` after ``timeout`` seconds."""
        if instance_name == self._me or (
            self._reads is not None and stream_name not in self._reads
        ):
            return
        if position <= self._positions[stream_name].received_position(instance_name):
            return
        d: defer.Deferred[None] = defer.Deferred()
        self._waiting[(stream_name, instance_name)].append((position, d))
        await self._clock.timeout(d, timeout)

    def release(self, stream_name: str, instance_name: str) -> None:
        """The writer's position moved: fire the waits it now satisfies."""
        key = (stream_name, instance_name)
        waiting = self._waiting.get(key)
        if not waiting:
            return
        received = self._positions[stream_name].received_position(instance_name)
        still = []
        for position, d in waiting:
            if d.called:
                continue
            if position <= received:
                d.callback(None)
            else:
                still.append((position, d))
        if still:
            self._waiting[key] = still
        else:
            del self._waiting[key]


class ReplicationReceiver:
    """Applies other processes' rows and positions (see the module docstring)."""

    def __init__(
        self,
        store: GenericWorkerStore,
        streams: Mapping[str, Stream],
        notifier: Notifier,
        waiters: PositionWaiters,
        row_hooks: Iterable[tuple[str, RowHook]] = (),
    ) -> None:
        """``row_hooks``: ``(stream name, hook)``, the role handlers taking a
        stream's rows: each gets every batch of rows (or bare position, with
        no rows) of its stream, after cache invalidation and before the
        position advances."""
        self._store = store
        self._streams = streams
        self._notifier = notifier
        self._waiters = waiters
        self._row_hooks: dict[str, list[RowHook]] = defaultdict(list)
        for stream_name, hook in row_hooks:
            self._row_hooks[stream_name].append(hook)

    def add_row_hook(self, stream_name: str, hook: RowHook) -> None:
        """Also hand a stream's rows to ``hook`` (for tests and benchmarks
        watching rows arrive; the composition root passes ``row_hooks``)."""
        self._row_hooks[stream_name].append(hook)

    def on_rows(self, stream_name: str, writer: str, token: int, rows: Sequence[Any]) -> None:
        """Rows of ``writer`` at ``token`` (none: a bare position)."""
        stream = self._streams[stream_name]
        definition = stream.definition
        if rows and definition.invalidate is not None:
            definition.invalidate(self._store, writer, token, rows)
        if rows and definition.changed_entity is not None:
            tracker = self._store.stream_changes.get(stream_name)
            if tracker is not None:
                entity_of = definition.changed_entity
                for row in rows:
                    # A batch's rows are recorded at its token: a row's own
                    # id may be lower, which only makes "may have changed"
                    # true for a little longer.
                    tracker.record(entity_of(row), token)
        for hook in self._row_hooks.get(stream_name, ()):
            try:
                hook(writer, token, rows)
            except Exception:
                logger.exception("Handling %s rows from %s failed", stream_name, writer)
        if rows:
            stream.positions.advance_past_row(writer, token)
            wake = definition.wake(rows)
            if wake.anyone:
                self._notifier.wake(wake)
        else:
            stream.positions.advance_writer(writer, token)
        self._waiters.release(stream_name, writer)
