"""SQLite: the embedded default, shared safely by several processes.

Every read-write transaction starts with ``BEGIN IMMEDIATE`` so it holds the
database write lock from its first statement: two processes can never
interleave writes, and a transaction never fails half-way because another one
upgraded its lock first. Read-only transactions use a deferred ``BEGIN`` and run
beside the writer thanks to WAL.

Sequences live in the ``sequences`` table. Because that table is transactional,
an id taken inside a transaction that rolls back would return to the sequence;
:meth:`Sqlite3Engine.rollback` therefore undoes the transaction's work back to a
savepoint and commits the sequence advance alone (the write lock is still held,
so no other process can take the same ids in between).
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import threading
from typing import Any

from synapse_lite.storage.engines.base import BaseDatabaseEngine, DBAPIConnection, DBAPICursor

logger = logging.getLogger(__name__)

_SEQUENCE_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_SAVEPOINT = "synapse_lite_txn_body"

#: Write transactions of a process between two checkpoints of its pool
#: (SQLite's own default is one per 1,000 pages of log, about 20-40 sends).
CHECKPOINT_EVERY_COMMITS = 32

#: Pages of log past which a pool connection's COMMIT checkpoints too
#: (SQLite's automatic checkpoint, at its default threshold).
AUTOCHECKPOINT_PAGES = 1000


def _check_sequence_name(name: str) -> str:
    if not _SEQUENCE_NAME.match(name):
        raise ValueError(f"invalid sequence name {name!r}")
    return name


class Sqlite3Engine(BaseDatabaseEngine):
    """The stdlib ``sqlite3`` engine (WAL, busy timeout, foreign keys on)."""

    name = "sqlite"
    writes_one_at_a_time = True

    def __init__(self, args: dict[str, Any]) -> None:
        super().__init__(args)
        self.path: str = args["path"]
        self.busy_timeout_ms: int = int(args.get("busy_timeout_ms", 30_000))
        # Threads of one process queue here rather than in SQLite's busy handler,
        # whose sleeps (up to 100 ms) would dominate write latency.
        self._write_lock = threading.Lock()
        self._thread = threading.local()
        #: Write commits since the last checkpoint was asked for, and
        #: whether one is asked for or running. Their own lock: the write
        #: lock is held through whole transactions, and the reactor asks.
        self._checkpoint_lock = threading.Lock()
        self._commits_since_checkpoint = 0
        self._checkpointing = False

    def _acquire_write_lock(self) -> None:
        self._write_lock.acquire()
        self._thread.holds_write_lock = True

    def _release_write_lock(self) -> None:
        if getattr(self._thread, "holds_write_lock", False):
            self._thread.holds_write_lock = False
            self._write_lock.release()

    def describe(self) -> str:
        return f"sqlite:{self.path}"

    def connect(self) -> DBAPIConnection:
        directory = os.path.dirname(os.path.abspath(self.path))
        os.makedirs(directory, exist_ok=True)
        conn = sqlite3.connect(
            self.path,
            timeout=self.busy_timeout_ms / 1000,
            isolation_level=None,  # we issue BEGIN ourselves
            check_same_thread=False,
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute(f"PRAGMA busy_timeout={self.busy_timeout_ms}")
        return conn

    def configure_pooled(self, conn: DBAPIConnection) -> None:
        # Temporary files in memory: chiefly the savepoint journal that every
        # write transaction keeps (``begin``'s SAVEPOINT: the original of each
        # page it changes). SQLite keeps that journal in memory up to 64 KiB
        # (16 pages), then moves it to a new, unlinked file in /var/tmp: an
        # open, an unlink and a write per page, in every send since the event
        # graph made a send change more pages than that (about 60 µs of
        # statement time per send and a third of the database thread's
        # system time; docs/scaling.md, issue 30). The pool's transactions
        # are request-sized, so the memory is too; the start-up connection
        # keeps the default, its schema upgrades may sort whole tables.
        conn.cursor().execute("PRAGMA temp_store=MEMORY")
        # Checkpoints: the pool copies the log into the database on one of
        # its threads, beside the writers, every CHECKPOINT_EVERY_COMMITS
        # write commits (:meth:`checkpoint_due`), so that SQLite's
        # automatic checkpoint, which runs inside the COMMIT that finds the
        # log past AUTOCHECKPOINT_PAGES while this process's other writers
        # wait for the write lock (``_write_lock``), finds little left to
        # copy (it used to copy and sync a tenth of the sends' pages there;
        # docs/scaling.md, issue 30). The automatic one stays on: SQLite
        # restarts the log from its start only when a writer begins and
        # finds it copied whole with no reader inside it, which the pool's
        # checkpoints alone, racing the writers, did not bring about, and
        # the log grew by every page ever written (227 MB for 1,800 sends).
        # Run in the COMMIT that follows, and again at each COMMIT until
        # the restart happens, it does.
        conn.cursor().execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")

    def convert_param_style(self, sql: str) -> str:
        return sql

    def is_retryable_error(self, exc: BaseException) -> bool:
        if isinstance(exc, sqlite3.OperationalError):
            message = str(exc).lower()
            return "locked" in message or "busy" in message
        return False

    def is_connection_error(self, exc: BaseException) -> bool:
        return isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc).lower()

    def begin(self, conn: DBAPIConnection, read_only: bool = False) -> None:
        if read_only:
            conn.cursor().execute("BEGIN DEFERRED")
            return
        self._acquire_write_lock()
        try:
            cur = conn.cursor()
            cur.execute("BEGIN IMMEDIATE")
            cur.execute(f"SAVEPOINT {_SAVEPOINT}")
        except BaseException:
            self._release_write_lock()
            raise

    def _end(self, conn: DBAPIConnection, statement: str) -> None:
        try:
            conn.cursor().execute(statement)
        finally:
            self._release_write_lock()

    def commit(self, conn: DBAPIConnection, read_only: bool = False) -> None:
        if read_only:
            conn.cursor().execute("COMMIT")
            return
        self._end(conn, "COMMIT")
        with self._checkpoint_lock:
            self._commits_since_checkpoint += 1

    def checkpoint_due(self) -> bool:
        """Every :data:`CHECKPOINT_EVERY_COMMITS` write commits of this
        process, one checkpoint at a time."""
        with self._checkpoint_lock:
            if self._checkpointing or self._commits_since_checkpoint < CHECKPOINT_EVERY_COMMITS:
                return False
            self._checkpointing = True
            self._commits_since_checkpoint = 0
            return True

    def checkpoint(self, conn: DBAPIConnection) -> None:
        """A passive checkpoint: copies the log's committed pages into the
        database (and syncs it) without taking the write lock, so writers
        go on meanwhile; pages a reader may still need stay in the log for
        the next one."""
        conn.cursor().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    def checkpoint_done(self) -> None:
        with self._checkpoint_lock:
            self._checkpointing = False

    def rollback(
        self, conn: DBAPIConnection, sequence_floors: dict[str, int], read_only: bool = False
    ) -> None:
        if read_only:
            conn.cursor().execute("ROLLBACK")
            return
        if not sequence_floors:
            self._end(conn, "ROLLBACK")
            return
        cur = conn.cursor()
        try:
            cur.execute(f"ROLLBACK TO {_SAVEPOINT}")
            for name, value in sequence_floors.items():
                self.sequence_set_at_least(cur, name, value)
        except sqlite3.Error:
            logger.exception(
                "Could not keep sequences %s past ids of a failed transaction", sequence_floors
            )
            self._end(conn, "ROLLBACK")
            raise
        self._end(conn, "COMMIT")

    def set_autocommit(self, conn: DBAPIConnection, autocommit: bool) -> None:
        # The connection is in autocommit whenever no BEGIN is active.
        return None

    @property
    def sequences_are_transactional(self) -> bool:
        return True

    def create_sequence_sql(self, name: str) -> list[str]:
        _check_sequence_name(name)
        return [
            "CREATE TABLE IF NOT EXISTS sequences ("
            " name TEXT NOT NULL PRIMARY KEY, last_value BIGINT NOT NULL)",
            f"INSERT INTO sequences (name, last_value) VALUES ('{name}', 0)",
        ]

    def sequence_next_values(self, cur: DBAPICursor, name: str, n: int) -> list[int]:
        sql = "UPDATE sequences SET last_value = last_value + ? WHERE name = ? RETURNING last_value"
        if cur.connection.in_transaction:  # type: ignore[attr-defined]
            cur.execute(sql, (n, name))
            row = cur.fetchone()
        else:
            # A statement on its own: queue behind this process's writers.
            self._acquire_write_lock()
            try:
                cur.execute(sql, (n, name))
                row = cur.fetchone()
            finally:
                self._release_write_lock()
        if row is None:
            raise RuntimeError(f"sequence {name!r} does not exist")
        last = int(row[0])
        return list(range(last - n + 1, last + 1))

    def sequence_last_value(self, cur: DBAPICursor, name: str) -> int:
        cur.execute("SELECT last_value FROM sequences WHERE name = ?", (name,))
        row = cur.fetchone()
        if row is None:
            raise RuntimeError(f"sequence {name!r} does not exist")
        return int(row[0])

    def sequence_set_at_least(self, cur: DBAPICursor, name: str, value: int) -> None:
        cur.execute(
            "UPDATE sequences SET last_value = MAX(last_value, ?) WHERE name = ?", (value, name)
        )
