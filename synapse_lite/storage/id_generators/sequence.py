"""Named sequences shared by every process: where stream ids come from."""

from __future__ import annotations

import logging

from synapse_lite.storage.database import LoggingDatabaseConnection, LoggingTransaction
from synapse_lite.storage.engines import BaseDatabaseEngine
from synapse_lite.streams.definition import IdSpace, StreamTable

logger = logging.getLogger(__name__)


class SequenceGenerator:
    """Hands out ids from one database sequence.

    On PostgreSQL this is a SEQUENCE; on SQLite a row of the ``sequences``
    table, advanced under the database write lock. Either way two processes
    never receive the same id, and an id observed in memory is never handed out
    again (see :meth:`BaseDatabaseEngine.rollback`).
    """

    def __init__(self, engine: BaseDatabaseEngine, sequence_name: str) -> None:
        self._engine = engine
        self.sequence_name = sequence_name

    def get_next_mult_txn(self, txn: LoggingTransaction, n: int) -> list[int]:
        """Take ``n`` increasing ids, in the caller's transaction."""
        ids = self._engine.sequence_next_values(txn.raw_cursor, self.sequence_name, n)
        if self._engine.sequences_are_transactional:
            floors = txn.sequence_floors
            floors[self.sequence_name] = max(floors.get(self.sequence_name, 0), ids[-1])
        return ids

    def get_max_allocated(self, txn: LoggingTransaction) -> int:
        """The largest id handed out so far (0 for a fresh sequence)."""
        return self._engine.sequence_last_value(txn.raw_cursor, self.sequence_name)

    def check_consistency(
        self,
        db_conn: LoggingDatabaseConnection,
        ids: IdSpace,
        stream_table: StreamTable,
        stream_name: str | None,
    ) -> None:
        """Repair a sequence left behind its table, and positions ahead of it.

        The sequence hands out positions; ``ids`` converts the stored ids of
        ``stream_table`` and ``stream_positions`` to compare. A table id above the
        sequence (rows inserted around it, or a restored backup) would make
        the sequence hand out an id twice: the sequence is moved forward with
        a warning. A ``stream_positions`` row above the sequence (after the
        table check, so above every row) claims ids nobody allocated: it is
        set back to the sequence, logged as an error.
        """
        table, id_column = stream_table.table, stream_table.id_column
        with db_conn.transaction(f"sequence.check_consistency({self.sequence_name})") as txn:
            txn.execute(f"SELECT {ids.newest_position_sql(id_column)} FROM {table}")
            row = txn.fetchone()
            table_max = max(int(row[0]) if row and row[0] is not None else 0, 0)
            last_value = self.get_max_allocated(txn)
            if table_max > last_value:
                logger.warning(
                    "Sequence %s is at %d but %s.%s holds id %d; moving the sequence forward",
                    self.sequence_name,
                    last_value,
                    table,
                    id_column,
                    ids.stored_id(table_max),
                )
                self._engine.sequence_set_at_least(txn.raw_cursor, self.sequence_name, table_max)
                last_value = table_max
            if stream_name is None:
                return
            txn.execute(
                f"SELECT {ids.newest_position_sql('stream_id')} FROM stream_positions"
                " WHERE stream_name = ?",
                (stream_name,),
            )
            row = txn.fetchone()
            positions_max = int(row[0]) if row and row[0] is not None else 0
            if positions_max > last_value:
                # A position no id ever reached can only come from a claim
                # that was never true (a peer's bogus POSITION recorded before
                # claims were verified, a restored backup, a reset sequence).
                # Refusing to start would make it permanent; setting it back
                # to the sequence loses nothing, because every row's id came
                # from the sequence and so lies at or below it.
                txn.execute(
                    "UPDATE stream_positions SET stream_id = ?"
                    f" WHERE stream_name = ? AND {ids.position_condition('stream_id', '>')}",
                    (ids.stored_id(last_value), stream_name, ids.stored_id(last_value)),
                )
                logger.error(
                    "REPAIRED: stream_positions said stream %r reached %d, but its sequence %s"
                    " has only handed out up to %d; %d row(s) set back to %d. A process"
                    " recorded a position nobody allocated (a false replication claim, a"
                    " restored backup or a reset sequence): check the replication logs.",
                    stream_name,
                    ids.stored_id(positions_max),
                    self.sequence_name,
                    last_value,
                    txn.rowcount,
                    ids.stored_id(last_value),
                )
