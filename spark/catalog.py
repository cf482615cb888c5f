"""What the audit knows about each stream before reading any row.

Built from :mod:`synapse_lite.storage.stream_ids` (tables and sequences) and the
homeserver config (writers), so the audit and the servers can never disagree on
where a stream's ids live.
"""

from __future__ import annotations

import attr

from synapse_lite.config.homeserver import HomeServerConfig
from synapse_lite.storage.stream_ids import STREAM_ID_SPACES, StreamTable


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AuditedStream:
    """One stream as the audit sees it.

    ``writers`` are the instances allowed to write it: its configured writers,
    or every process of the config for a stream any process may write.
    ``keeps_positions`` is False for such a stream: it has no
    ``stream_positions`` rows to check.
    """

    name: str
    sequence: str
    positive: bool
    tables: tuple[StreamTable, ...]
    writers: tuple[str, ...]
    keeps_positions: bool


@attr.s(slots=True, frozen=True, auto_attribs=True)
class AuditCatalog:
    """Every stream with rows in the database, and the tables to read."""

    streams: tuple[AuditedStream, ...]
    instances: tuple[str, ...]

    def stream(self, name: str) -> AuditedStream:
        for stream in self.streams:
            if stream.name == name:
                return stream
        raise KeyError(name)

    def stream_names(self) -> list[str]:
        return [s.name for s in self.streams]

    def tables(self) -> list[StreamTable]:
        """Each table once, although several streams may share it (events and
        backfill both live in ``events``, split by the sign of the id)."""
        seen: dict[str, StreamTable] = {}
        for stream in self.streams:
            for table in stream.tables:
                seen.setdefault(table.table, table)
        return list(seen.values())

    def sequences(self) -> list[str]:
        return sorted({s.sequence for s in self.streams})


def build_catalog(config: HomeServerConfig) -> AuditCatalog:
    """The streams of :data:`STREAM_ID_SPACES` with the writers ``config`` gives them."""
    instances = tuple(config.instance_names())
    streams = []
    for space in STREAM_ID_SPACES.values():
        configured = space.writers(config.stream_writers)
        streams.append(
            AuditedStream(
                name=space.stream_name,
                sequence=space.sequence_name,
                positive=space.positive,
                tables=space.tables,
                writers=tuple(configured) if configured else instances,
                keeps_positions=bool(configured),
            )
        )
    return AuditCatalog(tuple(streams), instances)
