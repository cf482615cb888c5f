"""The ID generators of every database stream, loaded together at startup.

One generator per stream definition with ids (``StreamDefinition.ids``), built
synchronously from the startup connection before the process serves anything;
stores take theirs from here, and replication advances them through the
process's streams.
"""

from __future__ import annotations

from collections.abc import Iterator

from synapse_lite.config.homeserver import MAIN_PROCESS, HomeServerConfig
from synapse_lite.position_log import PositionLog
from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.storage.database import DatabasePool, LoggingDatabaseConnection
from synapse_lite.storage.id_generators import MultiWriterIdGenerator
from synapse_lite.streams.definition import StreamDefinition


class StreamIdGenerators:
    """Every database stream's generator, by stream name."""

    def __init__(self, generators: dict[str, MultiWriterIdGenerator]) -> None:
        self._generators = generators

    @classmethod
    def load(
        cls,
        *,
        db_conn: LoggingDatabaseConnection,
        pool: DatabasePool,
        config: HomeServerConfig,
        instance_name: str,
        notifier: ReplicationNotifier,
        position_log: PositionLog | None,
    ) -> StreamIdGenerators:
        """Load every generator from the startup connection."""
        generators: dict[str, MultiWriterIdGenerator] = {}
        for definition in config.streams.with_ids():
            assert definition.ids is not None
            generators[definition.name] = MultiWriterIdGenerator(
                db_conn=db_conn,
                db=pool,
                notifier=notifier,
                stream_name=definition.name,
                instance_name=instance_name,
                tables=definition.ids.id_generator_tables(),
                sequence_name=definition.ids.sequence_name,
                writers=list(config.writers.writers(definition.name)),
                positive=definition.ids.positive,
                prune_removed_writers=instance_name == MAIN_PROCESS,
                position_log=position_log,
            )
        return cls(generators)

    def of(self, stream: StreamDefinition | str) -> MultiWriterIdGenerator:
        name = stream if isinstance(stream, str) else stream.name
        return self._generators[name]

    def __iter__(self) -> Iterator[MultiWriterIdGenerator]:
        return iter(self._generators.values())

    async def flush_positions(self) -> None:
        """Record every pending ``stream_positions`` update now (shutdown)."""
        for generator in self._generators.values():
            await generator.flush_stream_positions()
