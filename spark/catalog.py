"""What the audit knows about each stream before reading any row.

Built from the stream definitions the config carries
(``synapse_lite/streams/catalog.py``: tables and sequences) and the config's
writers, so the audit and the servers can never disagree on where a stream's
ids live: a new stream is audited as soon as it is defined.
"""

from __future__ import annotations

import attr

from synapse_lite.config.homeserver import HomeServerConfig
from synapse_lite.streams.definition import StreamTable


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
    """Every stream of ``config.streams`` with rows in the database, with the
    writers ``config`` gives them."""
    instances = tuple(config.instance_names())
    streams = []
    for definition in config.streams.with_ids():
        assert definition.ids is not None
        configured = config.writers.writers(definition.name)
        streams.append(
            AuditedStream(
                name=definition.name,
                sequence=definition.ids.sequence_name,
                positive=definition.ids.positive,
                tables=definition.ids.tables,
                writers=configured if configured else instances,
                keeps_positions=definition.keeps_positions,
            )
        )
    return AuditCatalog(tuple(streams), instances)
