"""Sequence reads without a database thread (``storage/reactor_reads.py``):
what they answer, and what they do when the server closes the connection,
stops answering, refuses the statement or cannot be reached."""

from __future__ import annotations

from typing import Any

import psycopg2
from twisted.internet import defer, reactor
from twisted.trial import unittest

from synapse_lite.storage.database import DatabasePool, LoggingTransaction
from synapse_lite.storage.engines import create_engine
from synapse_lite.storage.reactor_reads import (
    ReactorReads,
    ReactorReadsClosed,
    ReactorReadTimedOut,
)
from tests.harness.databases import create_test_database, test_engine_name

SEQUENCE = "probe_ids_seq"


class SequenceLastValueTestCase(unittest.TestCase):
    """``DatabasePool.sequence_last_value`` on the run's engine."""

    async def test_reads_the_largest_id_any_connection_took(self) -> None:
        test_db = create_test_database()
        self.addCleanup(test_db.drop)
        engine = test_db.make_engine()
        db = DatabasePool(reactor, engine, max_connections=1)
        self.addCleanup(db.close)

        def create(txn: LoggingTransaction) -> None:
            for sql in engine.create_sequence_sql(SEQUENCE):
                txn.execute(sql)

        def take(txn: LoggingTransaction, n: int) -> list[int]:
            return engine.sequence_next_values(txn.raw_cursor, SEQUENCE, n)

        await db.runInteraction("create", create)
        self.assertEqual(await db.sequence_last_value("read", SEQUENCE), 0)
        self.assertEqual(await db.runInteraction("take", take, 3), [1, 2, 3])
        self.assertEqual(await db.sequence_last_value("read", SEQUENCE), 3)
        # Ids taken after a read are seen by the next one.
        await db.runInteraction("take", take, 2)
        self.assertEqual(await db.sequence_last_value("read", SEQUENCE), 5)
        if test_engine_name() == "postgres":
            self.assertIsNotNone(db._reactor_reads)
        else:
            self.assertIsNone(db._reactor_reads)


class ReactorReadsTestCase(unittest.TestCase):
    """``ReactorReads`` against a real PostgreSQL server."""

    def setUp(self) -> None:
        if test_engine_name() != "postgres":
            raise unittest.SkipTest("runs when SYNAPSE_LITE_TEST_DB=postgres")
        self.test_db = create_test_database()
        self.addCleanup(self.test_db.drop)
        self.engine = self.test_db.make_engine()
        self.admin = self.engine.connect()
        self.addCleanup(self.admin.close)
        self.admin.autocommit = True  # type: ignore[attr-defined]
        with self.admin.cursor() as cur:
            cur.execute(f"CREATE SEQUENCE {SEQUENCE}")
            cur.execute(f"SELECT nextval('{SEQUENCE}') FROM generate_series(1, 7)")

    def reads(self, timeout: float = 10.0) -> ReactorReads:
        reads = ReactorReads(reactor, self.engine, timeout=timeout)
        self.addCleanup(reads.close)
        return reads

    async def last_value(self, reads: ReactorReads) -> int:
        row = await reads.fetch_one(self.engine.sequence_last_value_sql(SEQUENCE))
        return self.engine.sequence_last_value_of(row)

    def backends(self) -> set[int]:
        with self.admin.cursor() as cur:
            cur.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND pid <> pg_backend_pid()"
            )
            return {int(pid) for (pid,) in cur.fetchall()}

    async def test_statements_queued_together_are_answered_in_order(self) -> None:
        reads = self.reads()
        answers = await defer.gatherResults(
            [reads.fetch_one(f"SELECT {i}, pg_backend_pid()") for i in range(20)],
            consumeErrors=True,
        )
        self.assertEqual([row[0] for row in answers], list(range(20)))
        # All on the one connection.
        self.assertEqual({row[1] for row in answers}, {reads.backend_pid})
        self.assertEqual(await self.last_value(reads), 7)

    async def test_a_connection_the_server_closed_while_idle_is_replaced(self) -> None:
        reads = self.reads()
        self.assertEqual(await self.last_value(reads), 7)
        first = reads.backend_pid
        assert first is not None
        with self.admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", (first,))
            cur.execute(f"SELECT nextval('{SEQUENCE}')")
        self.assertEqual(await self.last_value(reads), 8)
        self.assertNotEqual(reads.backend_pid, first)

    async def test_a_server_that_stops_answering_times_out_and_the_next_read_works(
        self,
    ) -> None:
        reads = self.reads(timeout=0.5)
        self.assertEqual(await self.last_value(reads), 7)
        stuck = reads.backend_pid
        behind = reads.fetch_one(self.engine.sequence_last_value_sql(SEQUENCE))
        with self.assertRaises(ReactorReadTimedOut):
            await reads.fetch_one("SELECT pg_sleep(30)")
        self.assertIsNone(reads.backend_pid)
        # The read queued behind it goes on, on a new connection.
        self.assertEqual(self.engine.sequence_last_value_of(await behind), 7)
        self.assertNotEqual(reads.backend_pid, stuck)

    async def test_a_refused_statement_fails_alone(self) -> None:
        reads = self.reads()
        bad = reads.fetch_one("SELECT last_value FROM no_such_sequence")
        good = reads.fetch_one(self.engine.sequence_last_value_sql(SEQUENCE))
        with self.assertRaises(psycopg2.errors.UndefinedTable):
            await bad
        self.assertEqual(self.engine.sequence_last_value_of(await good), 7)

    async def test_an_unreachable_server_fails_the_read(self) -> None:
        # A port nobody listens on: connection refused, at once.
        args: dict[str, Any] = dict(self.test_db.args, port=1)
        reads = ReactorReads(reactor, create_engine("postgres", args), timeout=5.0)
        self.addCleanup(reads.close)
        with self.assertRaises(psycopg2.OperationalError):
            await reads.fetch_one("SELECT 1")
        self.assertIsNone(reads.backend_pid)

    async def test_close_fails_what_is_queued_and_closes_the_connection(self) -> None:
        reads = self.reads()
        self.assertEqual(await self.last_value(reads), 7)
        pid = reads.backend_pid
        self.assertIn(pid, self.backends())
        # A statement still running when close() comes (a fast one may be
        # answered before it), and three behind it. Its backend ends with
        # the statement, when it finds the connection gone.
        running = reads.fetch_one("SELECT pg_sleep(0.3)")
        queued = [reads.fetch_one("SELECT 1") for _ in range(3)]
        reads.close()
        for waiter in [running, *queued]:
            with self.assertRaises(ReactorReadsClosed):
                await waiter
        with self.assertRaises(ReactorReadsClosed):
            await reads.fetch_one("SELECT 1")

        async def gone() -> bool:
            return pid not in self.backends()

        for _ in range(50):
            if await gone():
                break
            await deferLater(0.05)
        self.assertNotIn(pid, self.backends())

    async def test_a_pool_closes_its_reads_connection(self) -> None:
        db = DatabasePool(reactor, self.engine, max_connections=1)
        self.assertEqual(await db.sequence_last_value("read", SEQUENCE), 7)
        assert db._reactor_reads is not None
        pid = db._reactor_reads.backend_pid
        self.assertIn(pid, self.backends())
        db.close()
        for _ in range(50):
            if pid not in self.backends():
                break
            await deferLater(0.05)
        self.assertNotIn(pid, self.backends())


def deferLater(seconds: float) -> defer.Deferred[None]:
    from twisted.internet import task

    return task.deferLater(reactor, seconds, lambda: None)
