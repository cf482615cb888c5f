"""Read-only access to the live database, through the project's database layer.

The audit must never write to the database it checks. SQLite is opened with
``mode=ro`` (a missing file is an error rather than a new empty database) and
PostgreSQL sessions are ``READ ONLY`` at REPEATABLE READ, so every statement of
one transaction sees one snapshot.
"""

from __future__ import annotations

import sqlite3
import urllib.parse
from typing import Any

from synapse_lite.storage.database import LoggingDatabaseConnection, LoggingTransaction
from synapse_lite.storage.engines import BaseDatabaseEngine, PostgresEngine, Sqlite3Engine


class DatabaseUnavailable(RuntimeError):
    """The database cannot be opened or read."""


def open_read_only(engine: BaseDatabaseEngine) -> LoggingDatabaseConnection:
    """A connection that cannot change the database; raises :class:`DatabaseUnavailable`."""
    try:
        if isinstance(engine, Sqlite3Engine):
            uri = "file:" + urllib.parse.quote(engine.path) + "?mode=ro"
            conn: Any = sqlite3.connect(
                uri,
                uri=True,
                timeout=engine.busy_timeout_ms / 1000,
                isolation_level=None,  # transactions are begun by the engine
                check_same_thread=False,
            )
            # mode=ro opens a missing file lazily; fail now with a clear reason.
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")
        elif isinstance(engine, PostgresEngine):
            conn = engine.connect()
            conn.set_session(readonly=True)
        else:
            raise DatabaseUnavailable(f"the audit does not support the {engine.name} engine")
    except DatabaseUnavailable:
        raise
    except Exception as e:
        raise DatabaseUnavailable(f"cannot open {engine.describe()} read-only: {e}") from e
    return LoggingDatabaseConnection(conn, engine, default_txn_name="audit")


def read_stream_positions(txn: LoggingTransaction) -> list[tuple[str, str, int]]:
    """Every ``stream_positions`` row (a few per stream)."""
    txn.execute("SELECT stream_name, instance_name, stream_id FROM stream_positions")
    return [(str(s), str(i), int(p)) for s, i, p in txn.fetchall()]


def read_sequences(
    txn: LoggingTransaction, engine: BaseDatabaseEngine, names: list[str]
) -> dict[str, int]:
    """The last value each sequence has handed out (0 when none)."""
    return {name: engine.sequence_last_value(txn.raw_cursor, name) for name in names}
