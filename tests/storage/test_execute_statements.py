"""``LoggingTransaction.execute_statements`` (one round trip on PostgreSQL):
the statements run in order, ``rowcount`` is the last one's, a failing one
fails the call, and none is an empty call; with ``insert_rows_statements``'
multi-row INSERTs, as the persist path sends a linear send's edges."""

from __future__ import annotations

from synapse_lite.storage.database import (
    LoggingDatabaseConnection,
    insert_rows_statements,
    make_startup_connection,
)
from tests.harness.server import DatabaseTestCase

EDGES = "event_edges (event_id, prev_event_id)"
MOVE = "UPDATE event_forward_extremities SET event_id = ? WHERE room_id = ? AND event_id = ?"


class ExecuteStatementsTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.conn: LoggingDatabaseConnection = make_startup_connection(self.test_db.make_engine())
        self.addCleanup(self.conn.close)

    def test_in_order_with_the_last_row_count(self) -> None:
        with self.conn.transaction() as txn:
            txn.execute(
                "INSERT INTO event_forward_extremities (room_id, event_id) VALUES (?, ?)",
                ("!r:x", "$a"),
            )
            statements = insert_rows_statements(EDGES, [("$b", "$a"), ("$c", "$b")])
            txn.execute_statements([*statements, (MOVE, ("$c", "!r:x", "$a"))])
            self.assertEqual(txn.rowcount, 1)
            # Nothing moved: the last statement's count, not the inserts'.
            txn.execute_statements([*insert_rows_statements(EDGES, [("$d", "$c")]),
                                    (MOVE, ("$d", "!r:x", "$zz"))])  # fmt: skip
            self.assertEqual(txn.rowcount, 0)
            txn.execute_statements([])
            txn.execute("SELECT event_id, prev_event_id FROM event_edges ORDER BY event_id")
            self.assertEqual(
                [tuple(r) for r in txn.fetchall()], [("$b", "$a"), ("$c", "$b"), ("$d", "$c")]
            )
            txn.execute("SELECT event_id FROM event_forward_extremities")
            self.assertEqual([tuple(r) for r in txn.fetchall()], [("$c",)])

    def test_a_failing_statement_fails_the_call(self) -> None:
        failed = False
        try:
            with self.conn.transaction() as txn:
                txn.execute_statements(
                    [
                        *insert_rows_statements(EDGES, [("$b", "$a")]),
                        ("INSERT INTO no_such_table (x) VALUES (?)", (1,)),
                    ]
                )
        except Exception as e:  # the driver's error: sqlite3's or psycopg2's
            failed = "no_such_table" in str(e)
        self.assertTrue(failed)
        with self.conn.transaction() as txn:
            txn.execute("SELECT COUNT(*) FROM event_edges")
            self.assertEqual(txn.fetchone()[0], 0)

    def test_rows_split_over_statements(self) -> None:
        rows = [(f"$e{i}", f"$p{i}") for i in range(1000)]
        statements = insert_rows_statements(EDGES, rows)
        self.assertEqual(len(statements), 3)  # 400 rows of 2 values each at most
        with self.conn.transaction() as txn:
            txn.execute_statements(statements)
            txn.execute("SELECT COUNT(*) FROM event_edges")
            self.assertEqual(txn.fetchone()[0], 1000)
        self.assertEqual(insert_rows_statements(EDGES, []), [])
