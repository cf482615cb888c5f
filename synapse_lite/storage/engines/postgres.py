"""PostgreSQL through psycopg2: the production engine.

Transactions run at REPEATABLE READ; serialization failures and deadlocks are
retried by the pool. Sequences are real PostgreSQL sequences, which never roll
back, so a failed transaction only leaves a gap.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from synapse_lite.storage.engines.base import BaseDatabaseEngine, DBAPIConnection, DBAPICursor

#: Statements sent to the server in one round trip by :meth:`execute_batch`.
BATCH_PAGE_SIZE = 200

_SEQUENCE_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")

# SQLSTATEs worth retrying the whole transaction for.
_RETRYABLE_PGCODES = {"40001", "40P01"}


def _check_sequence_name(name: str) -> str:
    if not _SEQUENCE_NAME.match(name):
        raise ValueError(f"invalid sequence name {name!r}")
    return name


@functools.lru_cache(maxsize=4096)
def _to_pyformat(sql: str) -> str:
    return sql.replace("%", "%%").replace("?", "%s")


class PostgresEngine(BaseDatabaseEngine):
    """psycopg2 at REPEATABLE READ, autocommit on request."""

    name = "postgres"

    def __init__(self, args: dict[str, Any]) -> None:
        super().__init__(args)
        import psycopg2  # noqa: F401  (fail early with a clear ImportError)

    def describe(self) -> str:
        host = self.args.get("host", "localhost")
        port = self.args.get("port", 5432)
        return f"postgres://{self.args.get('user', '')}@{host}:{port}/{self.args.get('dbname', '')}"

    def _connect_args(self) -> dict[str, Any]:
        connect_args = {
            k: v
            for k, v in self.args.items()
            if k in ("host", "port", "user", "password", "dbname", "options", "sslmode")
        }
        connect_args.setdefault("connect_timeout", 10)
        return connect_args

    def connect(self) -> DBAPIConnection:
        import psycopg2

        conn = psycopg2.connect(**self._connect_args())
        # The session's default, not psycopg2's set_session: with an isolation
        # level of its own psycopg2 sends a SET each time autocommit is turned
        # off again, one more round trip for every autocommit interaction
        # (a sequence read, a single-statement select). Every transaction
        # still begins at REPEATABLE READ.
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(
                "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL REPEATABLE READ"
            )
        conn.autocommit = False
        return conn

    def convert_param_style(self, sql: str) -> str:
        return _to_pyformat(sql)

    def is_retryable_error(self, exc: BaseException) -> bool:
        return getattr(exc, "pgcode", None) in _RETRYABLE_PGCODES

    def is_connection_error(self, exc: BaseException) -> bool:
        import psycopg2

        if isinstance(exc, psycopg2.InterfaceError):
            return True
        return isinstance(exc, psycopg2.OperationalError) and getattr(exc, "pgcode", None) is None

    def begin(self, conn: DBAPIConnection, read_only: bool = False) -> None:
        # psycopg2 opens the transaction implicitly at the first statement.
        return None

    def commit(self, conn: DBAPIConnection, read_only: bool = False) -> None:
        conn.commit()

    def rollback(
        self, conn: DBAPIConnection, sequence_floors: dict[str, int], read_only: bool = False
    ) -> None:
        conn.rollback()

    def set_autocommit(self, conn: DBAPIConnection, autocommit: bool) -> None:
        conn.autocommit = autocommit  # type: ignore[attr-defined]

    def execute_batch(self, cur: DBAPICursor, sql: str, rows: list[tuple[Any, ...]]) -> None:
        # psycopg2's executemany is one round trip per row; execute_batch
        # sends pages of statements, so persisting 100 events costs one trip.
        import psycopg2.extras

        psycopg2.extras.execute_batch(cur, sql, rows, page_size=BATCH_PAGE_SIZE)

    def execute_statements(
        self, cur: DBAPICursor, statements: list[tuple[str, tuple[Any, ...]]]
    ) -> None:
        # One round trip: psycopg2 sends the joined statements as one query
        # (client-side parameters), and ``rowcount`` is the last one's.
        cur.execute(
            "; ".join(sql for sql, _ in statements), [a for _, args in statements for a in args]
        )

    def create_sequence_sql(self, name: str) -> list[str]:
        return [f"CREATE SEQUENCE {_check_sequence_name(name)}"]

    def sequence_next_values(self, cur: DBAPICursor, name: str, n: int) -> list[int]:
        if n == 1:
            cur.execute("SELECT nextval(%s)", (name,))
            return [int(cur.fetchone()[0])]
        cur.execute("SELECT nextval(%s) FROM generate_series(1, %s)", (name, n))
        return sorted(int(row[0]) for row in cur.fetchall())

    def sequence_last_value(self, cur: DBAPICursor, name: str) -> int:
        cur.execute(self.sequence_last_value_sql(name))
        return self.sequence_last_value_of(cur.fetchone())

    reads_in_reactor = True

    def connect_nonblocking(self) -> Any:
        import psycopg2

        # Asynchronous connections are always in autocommit.
        return psycopg2.connect(**self._connect_args(), async_=True)

    def sequence_last_value_sql(self, name: str) -> str:
        return f"SELECT last_value, is_called FROM {_check_sequence_name(name)}"

    def sequence_last_value_of(self, row: tuple[Any, ...]) -> int:
        last_value, is_called = row
        return int(last_value) if is_called else int(last_value) - 1

    def sequence_set_at_least(self, cur: DBAPICursor, name: str, value: int) -> None:
        if value >= 1 and self.sequence_last_value(cur, name) < value:
            cur.execute("SELECT setval(%s, %s)", (name, value))
