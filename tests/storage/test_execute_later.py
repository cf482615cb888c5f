"""``LoggingTransaction.execute_later``: writes held until the transaction's
next statement (sent in its round trip on PostgreSQL) or its commit, in
order with every other statement; a held write that fails fails the
transaction, and nothing of it is kept. Both engines."""

from __future__ import annotations

from typing import Any
from unittest import mock

from twisted.internet import reactor

from synapse_lite.storage.database import (
    STATEMENTS_PER_ROUND_TRIP,
    DatabasePool,
    LoggingDatabaseConnection,
    LoggingTransaction,
    make_startup_connection,
)
from tests.harness.server import DatabaseTestCase

INSERT_EDGE = "INSERT INTO event_edges (event_id, prev_event_id) VALUES (?, ?)"
MOVE = "UPDATE event_forward_extremities SET event_id = ? WHERE room_id = ? AND event_id = ?"


class ExecuteLaterTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.engine = self.test_db.make_engine()
        self.conn: LoggingDatabaseConnection = make_startup_connection(self.engine)
        self.addCleanup(self.conn.close)

    def edges(self) -> list[tuple[Any, ...]]:
        with self.conn.transaction() as txn:
            txn.execute("SELECT event_id, prev_event_id FROM event_edges ORDER BY event_id")
            return [tuple(r) for r in txn.fetchall()]

    def test_held_until_the_next_statement_which_sees_them_and_keeps_its_results(
        self,
    ) -> None:
        with self.conn.transaction() as txn:
            txn.execute_later(INSERT_EDGE, [("$b", "$a"), ("$c", "$b")])
            txn.execute("SELECT event_id FROM event_edges ORDER BY event_id")
            self.assertEqual([tuple(r) for r in txn.fetchall()], [("$b",), ("$c",)])

    def test_the_next_statements_row_count_is_its_own(self) -> None:
        with self.conn.transaction() as txn:
            txn.execute(
                "INSERT INTO event_forward_extremities (room_id, event_id) VALUES (?, ?)",
                ("!r:x", "$a"),
            )
            txn.execute_later(INSERT_EDGE, [("$b", "$a"), ("$c", "$b"), ("$d", "$c")])
            txn.execute(MOVE, ("$d", "!r:x", "$zz"))
            self.assertEqual(txn.rowcount, 0)
            txn.execute_later(INSERT_EDGE, [("$e", "$d")])
            txn.execute_statements([(MOVE, ("$d", "!r:x", "$a"))])
            self.assertEqual(txn.rowcount, 1)
        self.assertEqual(len(self.edges()), 4)

    def test_sent_before_the_commit(self) -> None:
        with self.conn.transaction() as txn:
            txn.execute_later(INSERT_EDGE, [("$b", "$a")])
        self.assertEqual(self.edges(), [("$b", "$a")])

    def test_sent_before_a_batch_and_before_the_raw_cursor_is_used(self) -> None:
        with self.conn.transaction() as txn:
            txn.execute_later(INSERT_EDGE, [("$b", "$a")])
            txn.execute_batch(
                "UPDATE event_edges SET prev_event_id = ? WHERE event_id = ?", [("$z", "$b")]
            )
            txn.execute_later(INSERT_EDGE, [("$c", "$b")])
            cursor = txn.raw_cursor
            cursor.execute(self.engine.convert_param_style("SELECT COUNT(*) FROM event_edges"), ())
            self.assertEqual(cursor.fetchone()[0], 2)
        self.assertEqual(self.edges(), [("$b", "$z"), ("$c", "$b")])

    def test_more_than_one_round_trip_holds_are_all_sent(self) -> None:
        rows = [(f"$e{i:05}", "$p") for i in range(2 * STATEMENTS_PER_ROUND_TRIP + 3)]
        with self.conn.transaction() as txn:
            txn.execute_later(INSERT_EDGE, rows)
            txn.execute("SELECT COUNT(*) FROM event_edges")
            self.assertEqual(txn.fetchone()[0], len(rows))

    def test_held_writes_and_the_next_statement_share_one_call_to_the_engine(self) -> None:
        # One call of the engine's execute_statements: one round trip on
        # PostgreSQL (tests/storage/test_execute_statements.py).
        with self.conn.transaction() as txn:
            txn.execute_later(INSERT_EDGE, [("$b", "$a"), ("$c", "$b")])
            with mock.patch.object(
                self.engine, "execute_statements", wraps=self.engine.execute_statements
            ) as sent:
                txn.execute("SELECT COUNT(*) FROM event_edges")
                self.assertEqual(txn.fetchone()[0], 2)
                txn.execute("SELECT 1")
            self.assertEqual(sent.call_count, 1)
            self.assertEqual(len(sent.call_args.args[1]), 3)

    def test_a_transaction_that_fails_before_sending_them_keeps_none(self) -> None:
        with self.assertRaises(ValueError):
            with self.conn.transaction() as txn:
                txn.execute_later(INSERT_EDGE, [("$b", "$a")])
                raise ValueError("before any statement")
        self.assertEqual(self.edges(), [])

    def test_a_failing_held_write_fails_the_transaction_and_nothing_is_kept(self) -> None:
        failed = False
        try:
            with self.conn.transaction() as txn:
                txn.execute(INSERT_EDGE, ("$b", "$a"))
                txn.execute_later("INSERT INTO no_such_table (x) VALUES (?)", [(1,)])
        except Exception as e:  # the driver's error: sqlite3's or psycopg2's
            failed = "no_such_table" in str(e)
        self.assertTrue(failed)
        self.assertEqual(self.edges(), [])


class ExecuteLaterInPoolTestCase(DatabaseTestCase):
    """The same through ``DatabasePool.runInteraction``, which sends them
    before it commits and retries nothing of a failed one."""

    def setUp(self) -> None:
        super().setUp()
        self.db = DatabasePool(reactor, self.test_db.make_engine(), max_connections=1)
        self.addCleanup(self.db.close)

    async def count(self) -> int:
        rows = await self.db.select("count", "SELECT COUNT(*) FROM event_edges")
        return int(rows[0][0])

    async def test_sent_before_the_interaction_commits(self) -> None:
        def write(txn: LoggingTransaction) -> None:
            txn.execute_later(INSERT_EDGE, [("$b", "$a")])

        await self.db.runInteraction("write", write)
        self.assertEqual(await self.count(), 1)

    async def test_a_failing_held_write_fails_the_interaction(self) -> None:
        def write(txn: LoggingTransaction) -> None:
            txn.execute(INSERT_EDGE, ("$b", "$a"))
            # The same key again: the unique index refuses it at commit time.
            txn.execute_later(INSERT_EDGE, [("$b", "$a")])

        failed = False
        try:
            await self.db.runInteraction("write", write)
        except Exception as e:  # the driver's unique violation: sqlite3's or psycopg2's
            failed = "unique" in str(e).lower()
        self.assertTrue(failed)
        self.assertEqual(await self.count(), 0)
