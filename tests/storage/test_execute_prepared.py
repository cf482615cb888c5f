"""``LoggingTransaction.execute_prepared``: answers what ``execute`` does on
both engines; on PostgreSQL the statement is planned once per connection,
kept through a rolled-back transaction, prepared again when the session
lost it (the error is retryable), and a name stands for one text."""

from __future__ import annotations

from typing import Any

from synapse_lite.storage.database import LoggingDatabaseConnection, make_startup_connection
from tests.harness.server import DatabaseTestCase

EDGES = "SELECT prev_event_id FROM event_edges WHERE event_id = ? AND prev_event_id != ?"


class ExecutePreparedTestCase(DatabaseTestCase):
    def setUp(self) -> None:
        super().setUp()
        self.conn: LoggingDatabaseConnection = make_startup_connection(self.test_db.make_engine())
        self.addCleanup(self.conn.close)
        with self.conn.transaction() as txn:
            txn.execute_batch(
                "INSERT INTO event_edges (event_id, prev_event_id) VALUES (?, ?)",
                [("$b", "$a"), ("$b", "$z"), ("$c", "$b")],
            )

    def prepared_here(self) -> list[str]:
        with self.conn.transaction() as txn:
            txn.execute("SELECT name FROM pg_prepared_statements ORDER BY name")
            return [r[0] for r in txn.fetchall()]

    def edges(self, *args: Any) -> list[str]:
        with self.conn.transaction() as txn:
            txn.execute_prepared("test_edges", EDGES, args)
            return sorted(r[0] for r in txn.fetchall())

    def test_answers_what_execute_does(self) -> None:
        self.assertEqual(self.edges("$b", "$none"), ["$a", "$z"])
        self.assertEqual(self.edges("$b", "$z"), ["$a"])
        self.assertEqual(self.edges("$nothing", "$z"), [])
        with self.conn.transaction() as txn:
            txn.execute(EDGES, ("$c", "$z"))
            self.assertEqual([r[0] for r in txn.fetchall()], ["$b"])
        self.assertEqual(self.edges("$c", "$z"), ["$b"])

    def test_planned_once_per_connection_and_again_when_lost(self) -> None:
        if self.test_db.engine_name != "postgres":
            self.skipTest("SQLite's driver keeps compiled statements itself")
        self.edges("$b", "$none")
        self.assertEqual(self.prepared_here(), ["test_edges"])
        # Kept through a rolled-back transaction (PREPARE is not transactional).
        try:
            with self.conn.transaction() as txn:
                txn.execute_prepared("test_edges", EDGES, ("$b", "$z"))
                raise RuntimeError("roll back")
        except RuntimeError:
            pass
        self.assertEqual(self.edges("$b", "$z"), ["$a"])
        self.assertEqual(self.prepared_here(), ["test_edges"])
        # The session loses it: the next run fails with a retryable error,
        # and the one after prepares it again.
        with self.conn.transaction() as txn:
            txn.execute("DEALLOCATE ALL")
        failure: BaseException | None = None
        try:
            self.edges("$b", "$z")
        except Exception as e:
            failure = e
        assert failure is not None
        self.assertTrue(self.conn.engine.is_retryable_error(failure))
        self.assertEqual(self.edges("$b", "$z"), ["$a"])
        self.assertEqual(self.prepared_here(), ["test_edges"])
        # Another connection prepares it for itself.
        other = make_startup_connection(self.test_db.make_engine())
        self.addCleanup(other.close)
        with other.transaction() as txn:
            txn.execute_prepared("test_edges", EDGES, ("$c", "$z"))
            self.assertEqual([r[0] for r in txn.fetchall()], ["$b"])

    def test_a_name_stands_for_one_text(self) -> None:
        if self.test_db.engine_name != "postgres":
            self.skipTest("SQLite runs the text it is given")
        self.edges("$b", "$none")
        for name, sql in (("test_edges", EDGES + " LIMIT 1"), ("bad name; DROP", EDGES)):
            with self.assertRaises(ValueError):
                with self.conn.transaction() as txn:
                    txn.execute_prepared(name, sql, ("$b", "$z"))
