"""How far behind each writer this process is, for the operators' dashboards.

For every stream and writer: the newest position the writer announced (its
RDATA tokens and POSITIONs), how far this process's received position trails
it, and for how long it has trailed. A process keeping up shows zero most of
the time (rows are applied as they arrive); a catch-up, a backed-up stream
queue or a slow database shows as lag, in ids and seconds. The gauges read
this at scrape time (``synapse_lite_stream_announced_position``,
``synapse_lite_replication_lag_ids``, ``synapse_lite_replication_lag_seconds``).
"""

from __future__ import annotations

from collections.abc import Mapping

from synapse_lite.clock import Clock
from synapse_lite.metrics import (
    REPLICATION_LAG,
    REPLICATION_LAG_SECONDS,
    STREAM_ANNOUNCED_POSITION,
)
from synapse_lite.replication.streams import Stream

Key = tuple[str, str]  # (stream, writer)


class ReplicationLag:
    """The newest announced position of each writer, and how far behind it we are."""

    def __init__(self, clock: Clock, streams: Mapping[str, Stream]) -> None:
        self._clock = clock
        self._streams = streams
        self._newest: dict[Key, int] = {}
        #: When this process fell behind the writer (absent: caught up).
        self._behind_since: dict[Key, float] = {}

    def announced(self, stream_name: str, writer: str, position: int) -> None:
        """The writer says it is at ``position`` (a row's token or a POSITION)."""
        key = (stream_name, writer)
        stream = self._streams[stream_name]
        newest = self._newest.get(key)
        if newest is None:
            self._newest[key] = position
            self._export(key)
        elif position > newest or stream.positions.can_reset:
            # A stream kept in a writer's memory starts afresh with it.
            self._newest[key] = position
        if position > self._received(key) and key not in self._behind_since:
            self._behind_since[key] = self._clock.time()

    def applied(self, stream_name: str, writer: str, position: int) -> None:
        """Rows of the writer up to ``position`` were just applied here: what
        :meth:`announced` then :meth:`received` would record, in one call
        (a follower makes it for every batch of rows)."""
        key = (stream_name, writer)
        newest = self._newest.get(key)
        if newest is None:
            self._newest[key] = newest = position
            self._export(key)
        elif position > newest or self._streams[stream_name].positions.can_reset:
            self._newest[key] = newest = position
        if self._received(key) >= newest:
            self._behind_since.pop(key, None)
        elif key not in self._behind_since:
            self._behind_since[key] = self._clock.time()

    def received(self, stream_name: str, writer: str) -> None:
        """Rows (or a position) of the writer were applied here."""
        key = (stream_name, writer)
        if key in self._behind_since and self._received(key) >= self._newest.get(key, 0):
            del self._behind_since[key]

    def forget(self, stream_name: str, writer: str) -> None:
        """A writer retired for good."""
        key = (stream_name, writer)
        self._newest.pop(key, None)
        self._behind_since.pop(key, None)
        for gauge in (REPLICATION_LAG, REPLICATION_LAG_SECONDS, STREAM_ANNOUNCED_POSITION):
            try:
                gauge.remove(*key)
            except KeyError:
                pass

    def lag_ids(self, key: Key) -> int:
        if key not in self._newest:
            return 0
        return max(0, self._newest[key] - self._received(key))

    def lag_seconds(self, key: Key) -> float:
        since = self._behind_since.get(key)
        return 0.0 if since is None else max(0.0, self._clock.time() - since)

    def _received(self, key: Key) -> int:
        return self._streams[key[0]].positions.received_position(key[1])

    def _export(self, key: Key) -> None:
        REPLICATION_LAG.labels(*key).set_function(lambda: self.lag_ids(key))
        REPLICATION_LAG_SECONDS.labels(*key).set_function(lambda: self.lag_seconds(key))
        STREAM_ANNOUNCED_POSITION.labels(*key).set_function(lambda: self._newest.get(key, 0))
