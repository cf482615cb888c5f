"""Reads that need no transaction run without one: a single-statement
``select`` (and the sequence reads) in autocommit, one round trip on
PostgreSQL instead of BEGIN, the query and COMMIT, while every transaction
still runs at REPEATABLE READ, before and after them on the same connection."""

from __future__ import annotations

from twisted.internet import reactor
from twisted.trial import unittest

from synapse_lite.storage.database import DatabasePool, LoggingTransaction
from tests.harness.databases import create_test_database, test_engine_name


class AutocommitReadsTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.test_db = create_test_database()
        self.addCleanup(self.test_db.drop)
        self.engine = self.test_db.make_engine()
        # One connection: every interaction below shares it.
        self.db = DatabasePool(reactor, self.engine, max_connections=1)
        self.addCleanup(self.db.close)

    async def isolation_in_a_transaction(self) -> str:
        def read(txn: LoggingTransaction) -> str:
            txn.execute("SELECT current_setting('transaction_isolation')")
            return str(txn.fetchone()[0])

        return await self.db.runInteraction("isolation", read)

    async def test_a_select_is_its_own_transaction_and_transactions_stay_repeatable_read(
        self,
    ) -> None:
        if test_engine_name() != "postgres":
            # SQLite has no isolation levels to keep; its select is checked
            # by every test that reads.
            self.assertEqual(await self.db.select("one", "SELECT 1"), [(1,)])
            return
        self.assertEqual(await self.isolation_in_a_transaction(), "repeatable read")
        # No BEGIN before it: the statement began its own transaction.
        [(alone,)] = await self.db.select(
            "alone", "SELECT statement_timestamp() = transaction_timestamp()"
        )
        self.assertTrue(alone)
        self.assertEqual(await self.isolation_in_a_transaction(), "repeatable read")

        def two_statements(txn: LoggingTransaction) -> bool:
            txn.execute("SELECT statement_timestamp() = transaction_timestamp()")
            txn.execute("SELECT statement_timestamp() = transaction_timestamp()")
            return bool(txn.fetchone()[0])

        # A transaction's second statement is not its first.
        self.assertFalse(await self.db.runInteraction("two", two_statements))

    def test_psycopg2_adds_no_statement_of_its_own_around_autocommit(self) -> None:
        """With an isolation level set through psycopg2 (``set_session``),
        turning autocommit off again sends ``SET default_transaction_...``:
        a second round trip for every autocommit read. The level is the
        session's default instead, which psycopg2 leaves alone."""
        if test_engine_name() != "postgres":
            raise unittest.SkipTest("runs when SYNAPSE_LITE_TEST_DB=postgres")
        conn = self.engine.connect()
        self.addCleanup(conn.close)
        self.assertIsNone(conn.isolation_level)  # type: ignore[attr-defined]
        cur = conn.cursor()
        cur.execute("SELECT current_setting('transaction_isolation')")
        self.assertEqual(cur.fetchone()[0], "repeatable read")
