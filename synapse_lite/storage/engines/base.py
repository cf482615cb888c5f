"""The interface every database engine implements."""

from __future__ import annotations

import abc
from typing import Any, Protocol


class IncorrectDatabaseSetup(RuntimeError):
    """The database is in a state this server cannot safely run against."""


class DBAPICursor(Protocol):
    """The subset of a DB-API 2 cursor that we use."""

    rowcount: int
    description: Any

    def execute(self, sql: str, parameters: Any = ...) -> Any: ...
    def executemany(self, sql: str, seq_of_parameters: Any) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def close(self) -> None: ...


class DBAPIConnection(Protocol):
    """The subset of a DB-API 2 connection that we use."""

    def cursor(self) -> Any: ...
    def commit(self) -> None: ...
    def rollback(self) -> None: ...
    def close(self) -> None: ...


class BaseDatabaseEngine(abc.ABC):
    """What differs between SQLite and PostgreSQL."""

    #: ``sqlite`` or ``postgres``; used in logs and by the schema loader.
    name: str
    #: Write transactions run one at a time (a database-wide write lock):
    #: writes that queue for it gain by sharing a transaction
    #: (``storage/group_commit.py``).
    writes_one_at_a_time = False

    def __init__(self, args: dict[str, Any]) -> None:
        self.args = dict(args)

    @abc.abstractmethod
    def connect(self) -> DBAPIConnection:
        """Open and configure a new connection."""

    def configure_pooled(self, conn: DBAPIConnection) -> None:
        """Settings for a connection of a database pool (the transactions
        requests run), beyond what :meth:`connect` sets for every connection
        (the start-up one, which runs schema upgrades, included). None by
        default."""
        return None

    def checkpoint_due(self) -> bool:
        """Whether a pool should now run :meth:`checkpoint` (on one of its
        threads, off the write path); True at most once until
        :meth:`checkpoint_done`. Never, by default."""
        return False

    def checkpoint(self, conn: DBAPIConnection) -> None:
        """Write what the database's log holds into the database (between
        transactions, on a pool connection). Nothing by default."""
        return None

    def checkpoint_done(self) -> None:
        """The checkpoint :meth:`checkpoint_due` asked for ended (or failed)."""
        return None

    @abc.abstractmethod
    def convert_param_style(self, sql: str) -> str:
        """Rewrite ``?`` placeholders into the driver's style."""

    @abc.abstractmethod
    def is_retryable_error(self, exc: BaseException) -> bool:
        """True for failures that a retry of the whole transaction can fix
        (serialization failures, deadlocks, a busy database)."""

    @abc.abstractmethod
    def is_connection_error(self, exc: BaseException) -> bool:
        """True when the connection itself is broken and must be reopened."""

    @abc.abstractmethod
    def begin(self, conn: DBAPIConnection, read_only: bool = False) -> None:
        """Start a transaction (read-write unless ``read_only``)."""

    @abc.abstractmethod
    def commit(self, conn: DBAPIConnection, read_only: bool = False) -> None:
        """Commit the transaction started by :meth:`begin`."""

    @abc.abstractmethod
    def rollback(
        self, conn: DBAPIConnection, sequence_floors: dict[str, int], read_only: bool = False
    ) -> None:
        """Roll back the transaction started by :meth:`begin`.

        ``sequence_floors`` maps sequence names to ids the transaction took from
        them. Those ids may have been observed in memory, so they must never be
        handed out again: an engine whose sequences are transactional keeps the
        sequences at least that high while undoing everything else.
        """

    @abc.abstractmethod
    def set_autocommit(self, conn: DBAPIConnection, autocommit: bool) -> None:
        """Switch the connection in or out of the mode where each statement
        commits on its own."""

    # Sequences: named, shared by every process using the database.

    @abc.abstractmethod
    def create_sequence_sql(self, name: str) -> list[str]:
        """Statements that create a sequence whose first value is 1."""

    @abc.abstractmethod
    def sequence_next_values(self, cur: DBAPICursor, name: str, n: int) -> list[int]:
        """Take ``n`` increasing ids from a sequence."""

    @abc.abstractmethod
    def sequence_last_value(self, cur: DBAPICursor, name: str) -> int:
        """The largest id handed out so far (0 when none)."""

    #: Whether :meth:`connect_nonblocking` gives a connection the reactor can
    #: drive itself (``storage/reactor_reads.py``): PostgreSQL's.
    reads_in_reactor = False

    def connect_nonblocking(self) -> Any:
        """A new connection in the driver's asynchronous mode (psycopg2's
        ``async_``: autocommit, polled), for :attr:`reads_in_reactor` engines."""
        raise NotImplementedError(f"{self.name} has no asynchronous connections")

    def sequence_last_value_sql(self, name: str) -> str:
        """The one statement :meth:`sequence_last_value` runs, for
        :attr:`reads_in_reactor` engines; its row goes to
        :meth:`sequence_last_value_of`."""
        raise NotImplementedError(f"{self.name} reads its sequences in a transaction")

    def sequence_last_value_of(self, row: tuple[Any, ...]) -> int:
        """:meth:`sequence_last_value` from the row of :meth:`sequence_last_value_sql`."""
        raise NotImplementedError(f"{self.name} reads its sequences in a transaction")

    @abc.abstractmethod
    def sequence_set_at_least(self, cur: DBAPICursor, name: str, value: int) -> None:
        """Move a sequence forward so that its next id is above ``value``."""

    def execute_batch(self, cur: DBAPICursor, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """Run one statement (in the driver's placeholder style) once per row."""
        cur.executemany(sql, rows)

    def execute_statements(
        self, cur: DBAPICursor, statements: list[tuple[str, tuple[Any, ...]]]
    ) -> None:
        """Run ``statements`` (each in the driver's placeholder style, with
        its arguments) in order, in as few round trips as the driver allows;
        ``rowcount`` is then the last statement's. No results are read."""
        for sql, args in statements:
            cur.execute(sql, args)

    @property
    def sequences_are_transactional(self) -> bool:
        """Whether an id taken inside a rolled-back transaction returns to its
        sequence (SQLite: yes, PostgreSQL: no)."""
        return False

    def describe(self) -> str:
        """Where this engine connects, for logs (never includes passwords)."""
        return self.name
