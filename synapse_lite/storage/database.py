"""The database pool and the named, logged transactions everything runs in.

Two ways into the database:

* :class:`LoggingDatabaseConnection`: the one startup connection a process opens
  to check the schema and let every ID generator load its positions, before the
  reactor serves anything. Its transactions are named and logged like the pool's.
* :class:`DatabasePool`: a pool of threads, each with its own connection, behind
  :meth:`DatabasePool.runInteraction`.

SQL is written once, with ``?`` placeholders; :class:`LoggingTransaction`
converts it for the engine.
"""

from __future__ import annotations

import itertools
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

from twisted.internet import threads
from twisted.internet.interfaces import IReactorCore, IReactorFDSet
from twisted.python.threadpool import ThreadPool

from synapse_lite.api.errors import Codes, SynapseError
from synapse_lite.metrics import TRANSACTION_DURATION, TRANSACTION_IN_DOUBT, TRANSACTION_RETRIES
from synapse_lite.storage.engines import BaseDatabaseEngine
from synapse_lite.storage.engines.base import DBAPIConnection
from synapse_lite.storage.reactor_reads import ReactorReads

logger = logging.getLogger(__name__)
txn_logger = logging.getLogger("synapse_lite.storage.txn")

R = TypeVar("R")

#: Attempts of one interaction before a retryable failure is given up on.
MAX_ATTEMPTS = 5
#: Transactions slower than this are logged at WARNING.
SLOW_TRANSACTION_SECONDS = 1.0
#: Statements sent in one round trip at most by
#: :meth:`LoggingTransaction.execute_later`'s writes (bounds one query's size).
STATEMENTS_PER_ROUND_TRIP = 200


class LoggingTransaction:
    """A cursor inside one named transaction.

    Callbacks registered with :meth:`call_after` run on the reactor thread after
    the transaction commits; those registered with :meth:`call_on_exception`
    run on the database thread right after it rolls back (they must be
    thread-safe). A retried transaction gets a fresh set of callbacks for each
    attempt; a failed attempt's exception callbacks run before the retry.
    """

    __slots__ = (
        "_cursor",
        "_pending",
        "after_callbacks",
        "engine",
        "exception_callbacks",
        "name",
        "sequence_floors",
    )

    def __init__(self, cursor: Any, name: str, engine: BaseDatabaseEngine) -> None:
        self._cursor = cursor
        self.name = name
        self.engine = engine
        self.after_callbacks: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        self.exception_callbacks: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        #: ids taken from transactional sequences in this transaction (see
        #: :meth:`BaseDatabaseEngine.rollback`).
        self.sequence_floors: dict[str, int] = {}
        #: Writes given to :meth:`execute_later` (converted), not sent yet.
        self._pending: list[tuple[str, tuple[Any, ...]]] = []

    @property
    def database_engine(self) -> BaseDatabaseEngine:
        return self.engine

    def call_after(self, callback: Callable[..., object], *args: Any) -> None:
        """Run ``callback(*args)`` on the reactor thread once this commits."""
        self.after_callbacks.append((callback, args))

    def call_first_after(self, callback: Callable[..., object], *args: Any) -> None:
        """Like :meth:`call_after`, but before the callbacks registered so far
        (the id generator's finish among them: a change tracker must know of a
        row before its position becomes visible)."""
        self.after_callbacks.insert(0, (callback, args))

    def call_on_exception(self, callback: Callable[..., object], *args: Any) -> None:
        """Run ``callback(*args)`` (on the database thread) if this fails."""
        self.exception_callbacks.append((callback, args))

    def execute(self, sql: str, args: Sequence[Any] = ()) -> None:
        """Run one statement written with ``?`` placeholders (after the
        writes :meth:`execute_later` holds, in the same round trip where the
        engine allows)."""
        sql = self.engine.convert_param_style(sql)
        if txn_logger.isEnabledFor(logging.DEBUG):
            txn_logger.debug("[SQL] {%s} %s %r", self.name, sql, args)
        if self._pending:
            self._send_pending((sql, tuple(args)))
            return
        self._cursor.execute(sql, tuple(args))

    def execute_batch(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement once per row of arguments (in as few round trips
        as the engine allows; ``rowcount`` is not meaningful afterwards)."""
        sql = self.engine.convert_param_style(sql)
        batch = [tuple(r) for r in rows]
        if not batch:
            return
        if txn_logger.isEnabledFor(logging.DEBUG):
            txn_logger.debug("[SQL] {%s} %s (%d rows)", self.name, sql, len(batch))
        self.send_pending()
        self.engine.execute_batch(self._cursor, sql, batch)

    def execute_statements(self, statements: Sequence[tuple[str, Sequence[Any]]]) -> None:
        """Run several statements written with ``?`` placeholders, in order,
        in as few round trips as the engine allows (PostgreSQL: one);
        ``rowcount`` is then the last statement's. For writes whose results
        are not read (but the last one's row count)."""
        converted = [
            (self.engine.convert_param_style(sql), tuple(args)) for sql, args in statements
        ]
        if not converted:
            return
        if txn_logger.isEnabledFor(logging.DEBUG):
            for sql, args in converted:
                txn_logger.debug("[SQL] {%s} %s %r", self.name, sql, args)
        if self._pending:
            self._send_pending(*converted)
            return
        self.engine.execute_statements(self._cursor, converted)

    def execute_later(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """Run one statement (``?`` placeholders) once per row of arguments,
        later in this transaction: just before its next statement, in the
        same round trip on PostgreSQL, or before it commits. For writes
        whose results and row counts are not read, and whose failure fails
        the transaction: an error they raise comes out of that later call
        (or the commit). In order with every other statement of the
        transaction, so what runs after sees them."""
        sql = self.engine.convert_param_style(sql)
        for row in rows:
            self._pending.append((sql, tuple(row)))

    def send_pending(self) -> None:
        """Send the writes :meth:`execute_later` holds, now (the transaction
        does before it commits)."""
        if self._pending:
            self._send_pending()

    def _send_pending(self, *then: tuple[str, tuple[Any, ...]]) -> None:
        """The held writes, then ``then`` (converted), in pages of at most
        :data:`STATEMENTS_PER_ROUND_TRIP` statements; the last page ends with
        ``then``, so the cursor holds its last statement's row count."""
        statements = [*self._pending, *then]
        self._pending = []
        if txn_logger.isEnabledFor(logging.DEBUG):
            for sql, args in statements[: len(statements) - len(then)]:
                txn_logger.debug("[SQL] {%s} (held) %s %r", self.name, sql, args)
        for start in range(0, len(statements), STATEMENTS_PER_ROUND_TRIP):
            self.engine.execute_statements(
                self._cursor, statements[start : start + STATEMENTS_PER_ROUND_TRIP]
            )

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._cursor.fetchall())

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    @property
    def raw_cursor(self) -> Any:
        """The driver's cursor, for engine-specific calls (sequences); the
        held writes are sent first, so that calls on it come after them."""
        self.send_pending()
        return self._cursor

    def close(self) -> None:
        self._cursor.close()


def _run_callbacks(
    callbacks: list[tuple[Callable[..., object], tuple[Any, ...]]], what: str
) -> None:
    for callback, args in callbacks:
        try:
            callback(*args)
        except Exception:
            logger.exception("%s callback %r failed", what, callback)


class LoggingDatabaseConnection:
    """The startup connection: every transaction on it is named and timed."""

    def __init__(self, conn: DBAPIConnection, engine: BaseDatabaseEngine, default_txn_name: str):
        self.conn = conn
        self.engine = engine
        self.default_txn_name = default_txn_name

    @contextmanager
    def transaction(
        self, name: str | None = None, *, read_only: bool = False
    ) -> Iterator[LoggingTransaction]:
        """Run the block in one transaction, committed when the block ends.

        ``read_only`` transactions take no write lock (SQLite) and see one
        snapshot of the database for as long as they last.
        """
        txn_name = name or self.default_txn_name
        txn_logger.debug("[TXN START] {%s}", txn_name)
        start = time.monotonic()
        self.engine.begin(self.conn, read_only)
        txn = LoggingTransaction(self.conn.cursor(), txn_name, self.engine)
        try:
            yield txn
            txn.send_pending()
        except BaseException:
            self.engine.rollback(self.conn, txn.sequence_floors, read_only)
            _run_callbacks(txn.exception_callbacks, "exception")
            raise
        else:
            self.engine.commit(self.conn, read_only)
            _run_callbacks(txn.after_callbacks, "after")
        finally:
            duration = time.monotonic() - start
            TRANSACTION_DURATION.labels(txn_name).observe(duration)
            txn_logger.log(
                logging.INFO if duration >= SLOW_TRANSACTION_SECONDS else logging.DEBUG,
                "[TXN END] {%s} %.3f s",
                txn_name,
                duration,
            )

    def close(self) -> None:
        self.conn.close()


class DatabaseUnavailableError(SynapseError):
    """The database could not be reached (down, restarting, connection lost):
    ``503``, so that a client retries instead of treating the request as a
    server bug. Raised when connecting fails, or when a connection broke on
    every attempt of a transaction."""

    def __init__(self, desc: str) -> None:
        super().__init__(
            503,
            "The database is unavailable; try again in a few seconds",
            Codes.UNKNOWN,
        )
        self.desc = desc


class DatabasePool:
    """Runs named interactions on a pool of database threads.

    Each thread owns one connection, opened on first use and reopened when the
    engine reports it broken.
    """

    def __init__(
        self,
        reactor: IReactorCore,
        engine: BaseDatabaseEngine,
        *,
        name: str = "main",
        min_connections: int = 1,
        max_connections: int = 5,
    ) -> None:
        self._reactor = reactor
        self.reactor = reactor
        self.engine = engine
        self.name = name
        self._threadpool = ThreadPool(min_connections, max_connections, f"db-{name}")
        self._local = threading.local()
        self._connections: list[DBAPIConnection] = []
        self._connections_lock = threading.Lock()
        self._txn_counter = itertools.count()
        self._closed = False
        self._threadpool.start()
        #: Sequence reads on a connection the reactor drives, where the
        #: engine and the reactor allow it (reactor_reads.py: no thread on
        #: replication's latency path).
        self._reactor_reads = (
            ReactorReads(reactor, engine)
            if engine.reads_in_reactor and IReactorFDSet.providedBy(reactor)
            else None
        )

    # Connections

    def _get_connection(self) -> DBAPIConnection:
        conn: DBAPIConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self.engine.connect()
            self.engine.configure_pooled(conn)
            self._local.conn = conn
            with self._connections_lock:
                self._connections.append(conn)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is None:
            return
        with self._connections_lock:
            if conn in self._connections:
                self._connections.remove(conn)
        try:
            conn.close()
        except Exception:
            pass

    def close(self) -> None:
        """Stop the threads and close every connection."""
        if self._closed:
            return
        self._closed = True
        if self._reactor_reads is not None:
            self._reactor_reads.close()
        self._threadpool.stop()
        with self._connections_lock:
            conns, self._connections = self._connections, []
        for conn in conns:
            try:
                conn.close()
            except Exception:
                pass

    # Interactions

    async def runInteraction(
        self,
        desc: str,
        func: Callable[..., R],
        *args: Any,
        db_autocommit: bool = False,
        read_only: bool = False,
        idempotent: bool = False,
        **kwargs: Any,
    ) -> R:
        """Run ``func(txn, *args, **kwargs)`` in a transaction on a database thread.

        ``desc`` names the transaction in logs and metrics. With
        ``db_autocommit`` each statement commits on its own (for work that is
        atomic per statement, such as taking ids from a sequence). Failures the
        engine calls retryable are retried up to :data:`MAX_ATTEMPTS` times,
        except a connection that broke during COMMIT (the outcome is unknown:
        the first attempt may have committed): that is retried only when the
        caller says running ``func`` again after a commit is safe
        (``idempotent``: the write is keyed so a repeat writes nothing, such as
        events and to-device sends with their transaction ids), or for
        ``read_only`` and ``db_autocommit`` work; otherwise it is a
        :class:`DatabaseUnavailableError` (503), and the client's own retry
        (with its transaction id) decides.
        After-commit callbacks run here, on the reactor thread, before the
        result is returned.
        """
        if self._closed:
            raise RuntimeError(f"database pool {self.name!r} is closed")
        txn_id = next(self._txn_counter)
        name = f"{desc}-{txn_id:x}"
        after_callbacks: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        result: R = await threads.deferToThreadPool(
            self._reactor,  # type: ignore[arg-type]
            self._threadpool,
            self._new_transaction,
            desc,
            name,
            after_callbacks,
            db_autocommit,
            read_only,
            func,
            args,
            kwargs,
            idempotent,
        )
        _run_callbacks(after_callbacks, "after")
        if not read_only and self.engine.checkpoint_due():
            self._threadpool.callInThread(self._checkpoint)
        return result

    def _checkpoint(self) -> None:
        """On a pool thread: the engine's checkpoint (SQLite's log into the
        database), which :meth:`BaseDatabaseEngine.checkpoint_due` asked for
        after a write; a failure is logged, the next one is asked for
        later."""
        try:
            if self._closed:
                # Not a connection opened while the pool closes them.
                return
            start = time.monotonic()
            self.engine.checkpoint(self._get_connection())
            TRANSACTION_DURATION.labels("checkpoint").observe(time.monotonic() - start)
        except Exception as exc:
            logger.warning("checkpoint failed", exc_info=True)
            if self.engine.is_connection_error(exc):
                self._drop_connection()
        finally:
            self.engine.checkpoint_done()

    def _new_transaction(
        self,
        desc: str,
        name: str,
        after_callbacks: list[tuple[Callable[..., object], tuple[Any, ...]]],
        autocommit: bool,
        read_only: bool,
        func: Callable[..., R],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        idempotent: bool = False,
    ) -> R:
        engine = self.engine
        start = time.monotonic()
        txn_logger.debug("[TXN START] {%s}", name)
        attempt = 0
        try:
            while True:
                attempt += 1
                try:
                    conn = self._get_connection()
                except Exception as exc:
                    # Reconnecting at once would only fail again: tell the
                    # caller now, and try a new connection next time.
                    if engine.is_connection_error(exc):
                        raise DatabaseUnavailableError(desc) from exc
                    raise
                txn: LoggingTransaction | None = None
                began = False
                committing = False
                try:
                    if autocommit:
                        engine.set_autocommit(conn, True)
                    else:
                        engine.begin(conn, read_only)
                        began = True
                    txn = LoggingTransaction(conn.cursor(), name, engine)
                    result = func(txn, *args, **kwargs)
                    txn.send_pending()
                    if began:
                        committing = True
                        engine.commit(conn, read_only)
                        began = False
                    after_callbacks.extend(txn.after_callbacks)
                    return result
                except Exception as exc:
                    if began:
                        try:
                            engine.rollback(conn, txn.sequence_floors if txn else {}, read_only)
                        except Exception:
                            logger.warning("[TXN ROLLBACK FAILED] {%s}", name, exc_info=True)
                            self._drop_connection()
                    if txn is not None:
                        _run_callbacks(txn.exception_callbacks, "exception")
                    broken = engine.is_connection_error(exc)
                    if broken:
                        self._drop_connection()
                    retryable = broken or engine.is_retryable_error(exc)
                    if broken and committing and not (read_only or idempotent):
                        # In doubt: it may have committed. Running it again
                        # could write twice; the client's retry is safe.
                        TRANSACTION_IN_DOUBT.labels(desc).inc()
                        logger.warning(
                            "[TXN IN DOUBT] {%s} the connection broke during COMMIT; not"
                            " retried (503): %s",
                            name,
                            exc,
                        )
                        raise DatabaseUnavailableError(desc) from exc
                    if not retryable or attempt >= MAX_ATTEMPTS:
                        if broken:
                            raise DatabaseUnavailableError(desc) from exc
                        raise
                    TRANSACTION_RETRIES.labels(desc).inc()
                    txn_logger.warning(
                        "[TXN RETRY] {%s} attempt %d/%d failed: %s",
                        name,
                        attempt,
                        MAX_ATTEMPTS,
                        exc,
                    )
                    time.sleep(random.uniform(0.005, 0.02) * attempt)
                finally:
                    if autocommit:
                        try:
                            engine.set_autocommit(conn, False)
                        except Exception:
                            self._drop_connection()
        finally:
            duration = time.monotonic() - start
            TRANSACTION_DURATION.labels(desc).observe(duration)
            txn_logger.log(
                logging.WARNING if duration >= SLOW_TRANSACTION_SECONDS else logging.DEBUG,
                "[TXN END] {%s} %.3f s",
                name,
                duration,
            )

    async def execute(self, desc: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run one statement in its own transaction; return its rows, if any."""

        def query(txn: LoggingTransaction) -> list[tuple[Any, ...]]:
            txn.execute(sql, args)
            if txn.raw_cursor.description is None:
                return []
            return [tuple(row) for row in txn.fetchall()]

        return await self.runInteraction(desc, query)

    async def sequence_last_value(self, desc: str, name: str) -> int:
        """The largest id sequence ``name`` has handed out to anyone, read
        now, outside any transaction. On PostgreSQL the reactor runs the read
        itself (:mod:`~synapse_lite.storage.reactor_reads`): a claimed
        position waits for it before it is relayed. Timed under ``desc``
        with the transactions, either way."""
        if self._closed:
            raise RuntimeError(f"database pool {self.name!r} is closed")
        if self._reactor_reads is None:

            def read(txn: LoggingTransaction) -> int:
                return self.engine.sequence_last_value(txn.raw_cursor, name)

            return await self.runInteraction(desc, read, read_only=True, db_autocommit=True)
        start = time.monotonic()
        row = await self._reactor_reads.fetch_one(self.engine.sequence_last_value_sql(name))
        TRANSACTION_DURATION.labels(desc).observe(time.monotonic() - start)
        return self.engine.sequence_last_value_of(row)

    async def select(self, desc: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Run one query and return its rows. One statement sees one snapshot
        however it runs, so it runs in autocommit: one round trip on
        PostgreSQL instead of three (BEGIN, the query, COMMIT), which a
        woken /sync waits for (issue 35)."""

        def query(txn: LoggingTransaction) -> list[tuple[Any, ...]]:
            txn.execute(sql, args)
            return [tuple(row) for row in txn.fetchall()]

        return await self.runInteraction(desc, query, read_only=True, db_autocommit=True)


#: Values per multi-row INSERT: SQLite before 3.32 allows 999 parameters.
INSERT_VALUES_PER_STATEMENT = 800


def insert_rows_txn(txn: LoggingTransaction, table: str, rows: Sequence[Sequence[Any]]) -> None:
    """Insert ``rows`` (all of one width) into ``table`` (``"name (col1,
    col2, ...)"``) with one multi-row INSERT per
    :data:`INSERT_VALUES_PER_STATEMENT` values: one statement and one round
    trip where a batch would send one per row (and format each row in the
    driver)."""
    for sql, args in insert_rows_statements(table, rows):
        txn.execute(sql, args)


def insert_rows_statements(
    table: str, rows: Sequence[Sequence[Any]]
) -> list[tuple[str, list[Any]]]:
    """The statements (``?`` placeholders) and arguments of
    :func:`insert_rows_txn`, for :meth:`LoggingTransaction.execute_statements`."""
    if not rows:
        return []
    width = len(rows[0])
    marks = "(" + ", ".join("?" for _ in range(width)) + ")"
    per_statement = max(1, INSERT_VALUES_PER_STATEMENT // width)
    return [
        (
            f"INSERT INTO {table} VALUES " + ", ".join(marks for _ in chunk),
            [value for row in chunk for value in row],
        )
        for start in range(0, len(rows), per_statement)
        if (chunk := rows[start : start + per_statement])
    ]


def make_startup_connection(engine: BaseDatabaseEngine) -> LoggingDatabaseConnection:
    """Open the connection a process loads its state with before serving."""
    return LoggingDatabaseConnection(engine.connect(), engine, default_txn_name="startup")
