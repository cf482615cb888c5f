"""SQLite pool connections keep temporary files in memory (issue 30's send
cost: a send's savepoint journal grew past SQLite's 64 KiB and moved to a
new file in /var/tmp on every send; docs/scaling.md), the start-up
connection keeps SQLite's default; a pool transaction larger than that
journal limit still rolls back to its savepoint. The pool copies the log
into the database beside its writers, so that the checkpoint SQLite runs
inside a COMMIT finds little to copy (issue 30 again), and the log still
restarts from its start."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from twisted.internet import defer, reactor
from twisted.trial import unittest

from synapse_lite.storage.database import DatabasePool, LoggingTransaction, make_startup_connection
from synapse_lite.storage.engines import create_engine
from synapse_lite.storage.engines import sqlite as sqlite_engine
from synapse_lite.storage.engines.sqlite import CHECKPOINT_EVERY_COMMITS
from tests.harness.polling import eventually


class SqlitePoolSettingsTestCase(unittest.TestCase):
    def setUp(self) -> None:
        directory = tempfile.mkdtemp(prefix="sqlite_pool_")
        self.path = os.path.join(directory, "x.db")
        self.engine = create_engine("sqlite", {"path": self.path})
        self.startup = make_startup_connection(self.engine)
        self.addCleanup(self.startup.close)
        with self.startup.transaction() as txn:
            for sql in self.engine.create_sequence_sql("things"):
                txn.execute(sql)
            txn.execute("CREATE TABLE things (id BIGINT NOT NULL PRIMARY KEY, body TEXT)")
        self.pool = DatabasePool(reactor, self.engine, max_connections=1)
        self.addCleanup(self.pool.close)

    async def test_temp_store_in_memory_on_the_pool_only(self) -> None:
        def temp_store(txn: LoggingTransaction) -> int:
            txn.execute("PRAGMA temp_store")
            return int(txn.fetchone()[0])

        self.assertEqual(await self.pool.runInteraction("temp_store", temp_store), 2)
        with self.startup.transaction() as txn:
            self.assertEqual(temp_store(txn), 0)

    async def test_a_transaction_past_the_journal_limit_rolls_back(self) -> None:
        # 200 rows of 2 KB: about 100 pages changed, past the 16 pages SQLite
        # keeps in memory by default; the ids taken stay taken.
        def fill(txn: LoggingTransaction) -> None:
            ids = self.engine.sequence_next_values(txn.raw_cursor, "things", 200)
            txn.execute_batch(
                "INSERT INTO things (id, body) VALUES (?, ?)", [(i, "x" * 2000) for i in ids]
            )
            txn.sequence_floors["things"] = ids[-1]
            raise RuntimeError("fails after the writes")

        with self.assertRaises(RuntimeError):
            await self.pool.runInteraction("fill", fill)

        def read(txn: LoggingTransaction) -> tuple[int, int]:
            txn.execute("SELECT COUNT(*) FROM things")
            count = int(txn.fetchone()[0])
            return count, self.engine.sequence_last_value(txn.raw_cursor, "things")

        self.assertEqual(await self.pool.runInteraction("read", read), (0, 200))

    async def test_the_pool_checkpoints_beside_its_writers(self) -> None:
        """After ``CHECKPOINT_EVERY_COMMITS`` write transactions the pool
        runs one passive checkpoint on a thread of its own, which copies the
        log into the database file; SQLite's automatic checkpoint stays on
        at its default threshold (it restarts the log, the test below)."""

        def autocheckpoint(txn: LoggingTransaction) -> int:
            txn.execute("PRAGMA wal_autocheckpoint")
            return int(txn.fetchone()[0])

        self.assertEqual(
            await self.pool.runInteraction("pages", autocheckpoint, read_only=True),
            sqlite_engine.AUTOCHECKPOINT_PAGES,
        )
        with self.startup.transaction() as txn:
            self.assertEqual(autocheckpoint(txn), 1000)
        checkpoints: list[int] = []
        checkpoint = self.engine.checkpoint

        def counting(conn: Any) -> None:
            checkpoint(conn)
            checkpoints.append(os.path.getsize(self.path))

        self.patch(self.engine, "checkpoint", counting)
        size = os.path.getsize(self.path)

        def write(txn: LoggingTransaction, i: int) -> None:
            txn.execute("INSERT INTO things (id, body) VALUES (?, ?)", (i, "x" * 2000))

        for i in range(CHECKPOINT_EVERY_COMMITS):
            await self.pool.runInteraction("write", write, i)
            # Reads count for nothing.
            await self.pool.runInteraction("pages", autocheckpoint, read_only=True)
        await eventually(lambda: checkpoints, what="a checkpoint")
        # One (the set-up's commit counted too, so it came by the last write).
        self.assertEqual(len(checkpoints), 1)
        # The rows (2 KB each) are in the database file now.
        self.assertGreater(checkpoints[0], size + 32 * 2000)
        self.assertFalse(self.engine.checkpoint_due())


class SqliteLogRestartsTestCase(unittest.TestCase):
    """The log is found fully copied, now and then, when a writer begins, so
    SQLite restarts it from its start. A pool checkpoint that ran only
    beside the writers never was (they had appended meanwhile), and the log
    grew by every page ever written: 160-230 MB for 1,800 sends in
    ``bench.client`` (docs/scaling.md, issue 30)."""

    def setUp(self) -> None:
        directory = tempfile.mkdtemp(prefix="sqlite_log_")
        self.path = os.path.join(directory, "x.db")
        self.engine = create_engine("sqlite", {"path": self.path})
        startup = make_startup_connection(self.engine)
        self.addCleanup(startup.close)
        with startup.transaction() as txn:
            txn.execute("CREATE TABLE things (id INTEGER PRIMARY KEY, body TEXT)")
        self.pool = DatabasePool(reactor, self.engine, max_connections=4)
        self.addCleanup(self.pool.close)

    async def test_the_log_stays_bounded_under_concurrent_writers(self) -> None:
        # Past 100 pages (400 KB), not 1,000: the test writes less.
        self.patch(sqlite_engine, "AUTOCHECKPOINT_PAGES", 100)

        def write(txn: LoggingTransaction) -> None:
            for _ in range(4):
                txn.execute("INSERT INTO things (body) VALUES (?)", ("x" * 3000,))

        def count(txn: LoggingTransaction) -> int:
            txn.execute("SELECT COUNT(*) FROM things")
            return int(txn.fetchone()[0])

        rounds = 60
        for _ in range(rounds):
            work: list[defer.Deferred[object]] = [
                defer.ensureDeferred(self.pool.runInteraction("write", write)) for _ in range(4)
            ]
            read = self.pool.runInteraction("read", count, read_only=True)
            work.append(defer.ensureDeferred(read))
            await defer.gatherResults(work)
        written = rounds * 4 * 4 * 3000
        log = os.path.getsize(self.path + "-wal")
        # About 2.9 MB written, 6 MB of log without restarts (a page per row,
        # the index's pages); restarted past 400 KB, the file stays near
        # that (its size is its high-water mark).
        self.assertLess(log, 2_500_000, f"log of {log} bytes after {written} written")
        with open(self.path + "-wal", "rb") as f:
            header = f.read(16)
        # The log header's checkpoint sequence number: one more per restart.
        restarts = int.from_bytes(header[12:16], "big")
        self.assertGreaterEqual(restarts, 1)
        self.assertEqual(await self.pool.runInteraction("read", count, read_only=True), 960)
