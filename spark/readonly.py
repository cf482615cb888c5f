"""Read-only access to the live database, through the project's database layer.

The audit must never write to the database it checks, nor create files beside
it. SQLite is opened ``immutable=1`` when no server is writing, else ``mode=ro``
through its write-ahead log (a missing file is an error rather than a new
empty database: see :func:`sqlite_uri`), and
PostgreSQL sessions are ``READ ONLY`` at REPEATABLE READ, so every statement of
one transaction sees one snapshot.
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from typing import Any

from synapse_lite.storage.database import LoggingDatabaseConnection, LoggingTransaction
from synapse_lite.storage.engines import BaseDatabaseEngine, PostgresEngine, Sqlite3Engine


class DatabaseUnavailable(RuntimeError):
    """The database cannot be opened or read."""


def sqlite_uri(path: str, live: bool) -> tuple[str, bool]:
    """The URI to read the SQLite database at ``path`` without writing, and
    whether it is ``immutable``.

    ``mode=ro`` still creates the ``-wal`` and ``-shm`` files of a WAL database
    (the shared-memory index lives there), so it fails for a user who may
    only read the directory and, as root, leaves the two files behind. A
    stopped server's database (no write-ahead log, or an empty one: every
    commit is in the main file) is opened ``immutable=1``, which creates
    nothing. A live one (``live``, or a non-empty ``-wal``) must be read
    through its log, with ``mode=ro``."""
    wal = path + "-wal"
    has_log = os.path.exists(wal) and os.path.getsize(wal) > 0
    quoted = "file:" + urllib.parse.quote(path)
    if live or has_log:
        return quoted + "?mode=ro", False
    return quoted + "?mode=ro&immutable=1", True


def open_read_only(engine: BaseDatabaseEngine, live: bool = False) -> LoggingDatabaseConnection:
    """A connection that cannot change the database; raises :class:`DatabaseUnavailable`.

    ``live``: the servers may be writing (SQLite is then read through its WAL)."""
    try:
        if isinstance(engine, Sqlite3Engine):
            if not os.path.isfile(engine.path):
                raise DatabaseUnavailable(
                    f"cannot open {engine.describe()} read-only: no such file {engine.path}"
                )
            uri, immutable = sqlite_uri(engine.path, live)
            try:
                conn: Any = sqlite3.connect(
                    uri,
                    uri=True,
                    timeout=engine.busy_timeout_ms / 1000,
                    isolation_level=None,  # transactions are begun by the engine
                    check_same_thread=False,
                )
                # mode=ro opens lazily; fail now with a clear reason.
                conn.execute("SELECT 1 FROM sqlite_master LIMIT 1")
            except sqlite3.Error as e:
                if immutable:
                    raise
                directory = os.path.dirname(os.path.abspath(engine.path))
                raise DatabaseUnavailable(
                    f"cannot read {engine.describe()}: {e}. A live SQLite database (or one"
                    f" whose server stopped without checkpointing: {engine.path}-wal is not"
                    f" empty) is read through its write-ahead log, which needs write access"
                    f" to {directory} for the -shm file. Audit as a user who may write there,"
                    " or stop the server (it checkpoints on exit) and audit without --live"
                ) from e
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
