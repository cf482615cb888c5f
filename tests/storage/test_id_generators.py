"""MultiWriterIdGenerator, scenario by scenario, on the run's database engine.

Each test writes rows of a ``foobar`` stream (ids from ``foobar_seq``) the way a
writer would, builds generators the way processes do at startup, and states the
positions it expects in numbers.
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, reactor
from twisted.trial import unittest

from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.storage.database import (
    DatabasePool,
    LoggingTransaction,
    make_startup_connection,
)
from synapse_lite.storage.id_generators import MultiWriterIdGenerator
from synapse_lite.storage.id_generators import generator as id_generators
from synapse_lite.storage.prepare_database import prepare_database
from synapse_lite.streams.definition import IdSpace, StreamTable
from tests.harness.databases import create_test_database


class IdGeneratorTestCase(unittest.TestCase):
    """A fresh database with a ``foobar`` stream over the tables given."""

    tables: tuple[str, ...] = ("foobar",)
    positive = True

    def setUp(self) -> None:
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        self.test_db = create_test_database()
        self.addCleanup(self.test_db.drop)
        self.engine = self.test_db.make_engine()
        # One thread: allocations reach the database in the order they are made.
        self.db = DatabasePool(reactor, self.engine, max_connections=1)
        self.addCleanup(self.db.close)
        self.notifier = ReplicationNotifier()
        conn = make_startup_connection(self.engine)
        try:
            prepare_database(conn, is_main=True)
            with conn.transaction("create_foobar") as txn:
                for table in self.tables:
                    txn.execute(
                        f"CREATE TABLE {table} (stream_id BIGINT NOT NULL,"
                        " instance_name TEXT NOT NULL, data TEXT)"
                    )
                    txn.execute(f"CREATE UNIQUE INDEX {table}_id ON {table} (stream_id)")
                for statement in self.engine.create_sequence_sql("foobar_seq"):
                    txn.execute(statement)
        finally:
            conn.close()

    def make_id_gen(
        self, instance_name: str = "master", writers: list[str] | None = None, **kwargs: Any
    ) -> MultiWriterIdGenerator:
        conn = make_startup_connection(self.engine)
        try:
            id_gen = MultiWriterIdGenerator(
                db_conn=conn,
                db=self.db,
                notifier=self.notifier,
                stream_name="test_stream",
                instance_name=instance_name,
                ids=IdSpace(
                    "foobar_seq",
                    tuple(StreamTable(t) for t in self.tables),
                    positive=self.positive,
                ),
                writers=writers if writers is not None else [instance_name],
                **kwargs,
            )
        finally:
            conn.close()
        # Before the pool closes (cleanups run last-in first-out).
        self.addCleanup(id_gen.flush_stream_positions)
        return id_gen

    def insert_rows(
        self,
        instance_name: str,
        number: int,
        table: str | None = None,
        update_stream_table: bool = True,
    ) -> None:
        """Write ``number`` rows straight from the sequence, as a writer that has
        since stopped would have, recording its position unless told not to."""
        table = table or self.tables[0]
        factor = 1 if self.positive else -1
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction("insert_rows") as txn:
                last = 0
                for _ in range(number):
                    (last,) = self.engine.sequence_next_values(txn.raw_cursor, "foobar_seq", 1)
                    txn.execute(
                        f"INSERT INTO {table} (stream_id, instance_name) VALUES (?, ?)",
                        (last * factor, instance_name),
                    )
                if update_stream_table and number:
                    txn.execute(
                        "INSERT INTO stream_positions (stream_name, instance_name, stream_id)"
                        " VALUES ('test_stream', ?, ?) ON CONFLICT (stream_name, instance_name)"
                        " DO UPDATE SET stream_id = EXCLUDED.stream_id",
                        (instance_name, last * factor),
                    )
        finally:
            conn.close()

    def waste_ids(self, number: int) -> None:
        """Take ids from the sequence without writing rows (failed writes)."""
        conn = make_startup_connection(self.engine)
        try:
            with conn.transaction("waste_ids") as txn:
                self.engine.sequence_next_values(txn.raw_cursor, "foobar_seq", number)
        finally:
            conn.close()

    async def stored_positions(self) -> dict[str, int]:
        rows = await self.db.execute(
            "stored_positions",
            "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = ?",
            "test_stream",
        )
        return {name: int(pos) for name, pos in rows}

    async def write_row_with(self, id_gen: MultiWriterIdGenerator, instance_name: str) -> int:
        def txn_func(txn: LoggingTransaction) -> int:
            stream_id = id_gen.get_next_txn(txn)
            txn.execute(
                f"INSERT INTO {self.tables[0]} (stream_id, instance_name) VALUES (?, ?)",
                (stream_id, instance_name),
            )
            return stream_id

        return await self.db.runInteraction("write_row", txn_func)


class SingleWriterTestCase(IdGeneratorTestCase):
    def test_empty(self) -> None:
        id_gen = self.make_id_gen()
        self.assertEqual(id_gen.known_writer_positions(), {"master": 0})
        self.assertEqual(id_gen.persisted_upto_position(), 0)

    async def test_single_instance(self) -> None:
        self.insert_rows("master", 7)
        id_gen = self.make_id_gen()
        self.assertEqual(id_gen.known_writer_positions(), {"master": 7})
        self.assertEqual(id_gen.writer_position("master"), 7)

        async with id_gen.get_next() as stream_id:
            self.assertEqual(stream_id, 8)
            # Not visible until the block exits.
            self.assertEqual(id_gen.known_writer_positions(), {"master": 7})
            self.assertEqual(id_gen.persisted_upto_position(), 7)

        self.assertEqual(id_gen.known_writer_positions(), {"master": 8})
        self.assertEqual(id_gen.persisted_upto_position(), 8)

    async def test_get_next_mult(self) -> None:
        self.insert_rows("master", 2)
        id_gen = self.make_id_gen()
        async with id_gen.get_next_mult(3) as ids:
            self.assertEqual(ids, [3, 4, 5])
            self.assertEqual(id_gen.persisted_upto_position(), 2)
        self.assertEqual(id_gen.persisted_upto_position(), 5)

    async def test_get_next_txn(self) -> None:
        self.insert_rows("master", 7)
        id_gen = self.make_id_gen()
        seen: list[tuple[int, dict[str, int]]] = []

        def txn_func(txn: LoggingTransaction) -> None:
            stream_id = id_gen.get_next_txn(txn)
            seen.append((stream_id, id_gen.known_writer_positions()))

        await self.db.runInteraction("test", txn_func)
        self.assertEqual(seen, [(8, {"master": 7})])
        self.assertEqual(id_gen.known_writer_positions(), {"master": 8})

    async def test_failed_txn_finishes_its_id(self) -> None:
        """An id from a rolled-back transaction leaves a gap; the position
        passes it and the sequence never hands it out again."""
        self.insert_rows("master", 7)
        id_gen = self.make_id_gen()

        def failing(txn: LoggingTransaction) -> None:
            id_gen.get_next_txn(txn)
            raise ValueError("boom")

        with self.assertRaises(ValueError):
            await self.db.runInteraction("failing", failing)
        self.assertEqual(id_gen.known_writer_positions(), {"master": 8})
        self.assertEqual(await self.write_row_with(id_gen, "master"), 9)
        # Nothing to record for the failure, 9 for the success.
        await id_gen.flush_stream_positions()
        self.assertEqual(await self.stored_positions(), {"master": 9})

    async def test_out_of_order_finish(self) -> None:
        self.insert_rows("master", 7)
        id_gen = self.make_id_gen()
        blocks = [id_gen.get_next() for _ in range(4)]
        ids = [await block.__aenter__() for block in blocks]
        self.assertEqual(ids, [8, 9, 10, 11])

        positions = []
        for index in (1, 0, 3, 2):  # finish 9, 8, 11, 10
            await blocks[index].__aexit__(None, None, None)
            positions.append(id_gen.writer_position("master"))
        self.assertEqual(positions, [7, 9, 9, 11])
        self.assertEqual(id_gen.persisted_upto_position(), 11)

    async def test_cancelled_enter_does_not_wedge_position(self) -> None:
        self.insert_rows("master", 7)
        id_gen = self.make_id_gen()

        async def allocate() -> None:
            async with id_gen.get_next():
                raise AssertionError("the block must not run")

        attempt = defer.ensureDeferred(allocate())
        attempt.cancel()  # while the id is being fetched on a database thread
        self.failureResultOf(attempt, defer.CancelledError)

        async with id_gen.get_next() as stream_id:
            self.assertEqual(stream_id, 9)  # 8 went to the abandoned attempt
        self.assertEqual(id_gen.writer_position("master"), 9)
        self.assertEqual(id_gen.persisted_upto_position(), 9)

    async def test_exception_in_block_finishes_id(self) -> None:
        id_gen = self.make_id_gen()
        with self.assertRaises(ValueError):
            async with id_gen.get_next():
                raise ValueError("write failed")
        self.assertEqual(id_gen.persisted_upto_position(), 1)
        await id_gen.flush_stream_positions()
        # Recorded at startup (0); a failed write is not recorded.
        self.assertEqual(await self.stored_positions(), {"master": 0})

    async def test_restart_during_out_of_order_persistence(self) -> None:
        """A process starting while 8 is in flight and 9 has finished sees 7."""
        self.insert_rows("master", 7)
        id_gen = self.make_id_gen()
        block8 = id_gen.get_next()
        block9 = id_gen.get_next()
        self.assertEqual(await block8.__aenter__(), 8)
        self.assertEqual(await block9.__aenter__(), 9)
        await self.db.execute(
            "insert9", "INSERT INTO foobar (stream_id, instance_name) VALUES (9, 'master')"
        )
        await block9.__aexit__(None, None, None)
        await id_gen.flush_stream_positions()

        worker = self.make_id_gen("worker", writers=["master"])
        self.assertEqual(worker.known_writer_positions(), {"master": 7})
        self.assertEqual(worker.persisted_upto_position(), 7)

        await block8.__aexit__(None, None, None)
        self.assertEqual(id_gen.known_writer_positions(), {"master": 9})
        worker.advance_writer("master", 9)
        self.assertEqual(worker.known_writer_positions(), {"master": 9})
        self.assertEqual(worker.persisted_upto_position(), 9)

    def test_non_writer_cannot_allocate(self) -> None:
        worker = self.make_id_gen("worker", writers=["master"])
        self.assertFalse(worker.is_writer)
        with self.assertRaises(RuntimeError):
            worker.get_next()

    async def test_stream_positions_never_backwards(self) -> None:
        id_gen = self.make_id_gen()
        await self.write_row_with(id_gen, "master")
        await id_gen.flush_stream_positions()
        self.assertEqual(await self.stored_positions(), {"master": 1})
        await self.db.execute(
            "bump", "UPDATE stream_positions SET stream_id = 50 WHERE stream_name = 'test_stream'"
        )
        await self.write_row_with(id_gen, "master")
        await id_gen.flush_stream_positions()
        self.assertEqual(await self.stored_positions(), {"master": 50})

    async def test_stream_positions_written_after_each_write(self) -> None:
        id_gen = self.make_id_gen()
        for expected in (1, 2, 3):
            await self.write_row_with(id_gen, "master")
            await id_gen.flush_stream_positions()
            self.assertEqual(await self.stored_positions(), {"master": expected})

    async def test_no_writers_keeps_no_stream_positions(self) -> None:
        """The caches stream: anyone may write, nothing is stored or read."""
        self.insert_rows("other", 4, update_stream_table=False)
        id_gen = self.make_id_gen("master", writers=[])
        self.assertEqual(id_gen.persisted_upto_position(), 4)
        self.assertEqual(await self.write_row_with(id_gen, "master"), 5)
        await id_gen.flush_stream_positions()
        self.assertEqual(await self.stored_positions(), {})
        self.assertEqual(id_gen.persisted_upto_position(), 5)

    async def test_sequence_consistency(self) -> None:
        """A row written around the sequence moves the sequence forward."""
        self.insert_rows("master", 3)
        conn = make_startup_connection(self.engine)
        with conn.transaction() as txn:
            txn.execute("INSERT INTO foobar (stream_id, instance_name) VALUES (26, 'master')")
        conn.close()
        id_gen = self.make_id_gen()
        self.assertEqual(id_gen.persisted_upto_position(), 26)
        async with id_gen.get_next() as stream_id:
            self.assertEqual(stream_id, 27)

    def test_position_ahead_of_sequence_is_repaired_at_startup(self) -> None:
        """A stored position nobody allocated (a believed false claim) is set
        back to the sequence, loudly, instead of stopping startup forever."""
        self.insert_rows("master", 3)
        conn = make_startup_connection(self.engine)
        with conn.transaction() as txn:
            txn.execute("UPDATE stream_positions SET stream_id = 90")
        conn.close()
        with self.assertLogs("synapse_lite.storage.id_generators.sequence", "ERROR") as logs:
            id_gen = self.make_id_gen()
        self.assertIn("REPAIRED", logs.output[0])
        self.assertIn("90", logs.output[0])
        self.assertEqual(id_gen.persisted_upto_position(), 3)
        self.assertEqual(id_gen.writer_position("master"), 3)
        conn = make_startup_connection(self.engine)
        with conn.transaction() as txn:
            txn.execute("SELECT stream_id FROM stream_positions")
            self.assertEqual([int(r[0]) for r in txn.fetchall()], [3])
        conn.close()

    async def test_startup_reads_only_rows_after_stored_positions(self) -> None:
        """Startup reads the rows at or after the smallest stored position,
        however long the table is."""
        self.insert_rows("master", 500)
        self.insert_rows("master", 3, update_stream_table=False)
        id_gen = self.make_id_gen("worker", writers=["master"])
        self.assertEqual(id_gen.startup_rows_read, 4)  # 500 (the stored position) to 503
        self.assertEqual(id_gen.persisted_upto_position(), 503)


class MultiWriterTestCase(IdGeneratorTestCase):
    def replicate(
        self, writer: MultiWriterIdGenerator, name: str, *others: MultiWriterIdGenerator
    ) -> None:
        for other in others:
            other.advance_writer(name, writer.writer_position(name))

    def test_get_persisted_upto_position(self) -> None:
        self.insert_rows("first", 3)
        self.insert_rows("second", 5)  # ids 4-8, stored position 8
        conn = make_startup_connection(self.engine)
        with conn.transaction() as txn:
            # Stored positions first=3, second=5: second's later rows are not
            # contiguous with anything we know (6-8 exist but 4-5 do too).
            txn.execute("DELETE FROM foobar WHERE stream_id > 5")
            txn.execute("UPDATE stream_positions SET stream_id = 5 WHERE instance_name = 'second'")
        conn.close()
        id_gen = self.make_id_gen("worker", writers=["first", "second"])
        self.assertEqual(id_gen.known_writer_positions(), {"first": 3, "second": 5})
        # Rows 4 and 5 after first's position make persisted-up-to 5.
        self.assertEqual(id_gen.persisted_upto_position(), 5)

        # Rows arrive (RDATA): each is a finished id.
        id_gen.advance_past_row("first", 6)
        self.assertEqual(id_gen.persisted_upto_position(), 6)
        id_gen.advance_past_row("second", 7)
        self.assertEqual(id_gen.persisted_upto_position(), 7)
        id_gen.advance_past_row("second", 9)
        self.assertEqual(id_gen.persisted_upto_position(), 7)  # 8 not yet seen
        id_gen.advance_past_row("first", 8)
        self.assertEqual(id_gen.persisted_upto_position(), 9)
        id_gen.advance_past_row("first", 11)
        id_gen.advance_past_row("second", 15)
        self.assertEqual(id_gen.persisted_upto_position(), 11)

    def test_a_position_is_not_a_finished_id(self) -> None:
        """POSITION 6 from first says first has nothing unfinished up to 6; id 6
        may be second's, in flight, so persisted-up-to waits for second."""
        self.insert_rows("first", 3)
        self.insert_rows("second", 2)  # 4, 5
        id_gen = self.make_id_gen("worker", writers=["first", "second"])
        self.assertEqual(id_gen.persisted_upto_position(), 5)
        id_gen.advance_writer("first", 6)
        self.assertEqual(id_gen.persisted_upto_position(), 5)
        id_gen.advance_writer("second", 6)
        self.assertEqual(id_gen.persisted_upto_position(), 6)

    async def test_get_persisted_upto_position_get_next(self) -> None:
        """A writer restarting starts at the sequence head."""
        self.insert_rows("first", 3)
        self.insert_rows("second", 2)
        id_gen = self.make_id_gen("first", writers=["first", "second"])
        self.assertEqual(id_gen.known_writer_positions(), {"first": 5, "second": 5})
        self.assertEqual(id_gen.persisted_upto_position(), 5)
        async with id_gen.get_next() as stream_id:
            self.assertEqual(stream_id, 6)
            self.assertEqual(id_gen.persisted_upto_position(), 5)
        self.assertEqual(id_gen.persisted_upto_position(), 6)

    async def test_multi_instance(self) -> None:
        first = self.make_id_gen("first", writers=["first", "second"])
        second = self.make_id_gen("second", writers=["first", "second"])
        for _ in range(3):
            await self.write_row_with(first, "first")
        for _ in range(4):
            await self.write_row_with(second, "second")
        self.replicate(first, "first", second)
        self.replicate(second, "second", first)

        self.assertEqual(first.known_writer_positions(), {"first": 3, "second": 7})
        self.assertEqual(second.known_writer_positions(), {"first": 3, "second": 7})
        # first is idle, so it is as far along as anything it has seen.
        self.assertEqual(first.writer_position("first"), 7)
        self.assertEqual(second.writer_position("second"), 7)
        self.assertEqual(first.persisted_upto_position(), 7)  # every id 1-7 has finished

        async with first.get_next() as stream_id:
            self.assertEqual(stream_id, 8)
            self.assertEqual(first.known_writer_positions(), {"first": 3, "second": 7})
        self.assertEqual(first.known_writer_positions(), {"first": 8, "second": 7})

        # second has not heard of 8 yet.
        async with second.get_next() as stream_id:
            self.assertEqual(stream_id, 9)
        self.assertEqual(second.known_writer_positions(), {"first": 3, "second": 9})
        second.advance_writer("first", 8)
        self.assertEqual(second.known_writer_positions(), {"first": 8, "second": 9})
        self.assertEqual(second.persisted_upto_position(), 9)

    async def test_multi_instance_empty_row(self) -> None:
        """A new writer with no rows starts at the others' position."""
        self.insert_rows("first", 3)
        self.insert_rows("second", 4)
        third = self.make_id_gen("third", writers=["first", "second", "third"])
        self.assertEqual(third.known_writer_positions(), {"first": 3, "second": 7, "third": 7})
        for name in ("first", "second", "third"):
            self.assertEqual(third.writer_position(name), 7)
        async with third.get_next() as stream_id:
            self.assertEqual(stream_id, 8)
            self.assertEqual(third.known_writer_positions()["third"], 7)
        self.assertEqual(third.known_writer_positions()["third"], 8)

    async def test_writer_config_change(self) -> None:
        """Writers removed, added and re-added: no position goes backwards and
        a new writer never reads the table from zero."""
        self.insert_rows("first", 3)  # 1-3
        self.waste_ids(1)  # 4: a failed write
        self.insert_rows("second", 1)  # 5
        worker = self.make_id_gen("worker", writers=["first", "second"])
        self.assertEqual(worker.persisted_upto_position(), 3)
        self.assertEqual(worker.writer_position("first"), 3)
        self.assertEqual(worker.writer_position("second"), 5)

        # first is removed: it is assumed to have finished everything.
        worker = self.make_id_gen("worker", writers=["second"])
        self.assertEqual(worker.persisted_upto_position(), 5)
        self.assertEqual(await self.stored_positions(), {"second": 5})

        # second is replaced by third, which starts where the stream is.
        third = self.make_id_gen("third", writers=["third"])
        self.assertEqual(third.persisted_upto_position(), 5)
        self.assertEqual(third.writer_position("third"), 5)
        self.assertEqual(third.startup_rows_read, 1)  # row 5 only
        fourth = self.make_id_gen("fourth", writers=["third"])
        self.assertEqual(fourth.writer_position("third"), 5)

        self.assertEqual(await self.write_row_with(third, "third"), 6)
        self.assertEqual(third.persisted_upto_position(), 6)
        await third.flush_stream_positions()

        # first comes back beside third: it restarts at the sequence head, and
        # no position goes back to 3.
        first = self.make_id_gen("first", writers=["first", "third"])
        self.assertEqual(first.persisted_upto_position(), 6)
        self.assertEqual(first.writer_position("first"), 6)
        self.assertEqual(first.writer_position("third"), 6)
        self.assertEqual(await self.write_row_with(first, "first"), 7)
        self.assertEqual(first.persisted_upto_position(), 7)

    async def test_minimal_local_token(self) -> None:
        first = self.make_id_gen("first", writers=["first", "second"])
        second = self.make_id_gen("second", writers=["first", "second"])
        for _ in range(3):
            await self.write_row_with(first, "first")
        for _ in range(4):
            await self.write_row_with(second, "second")
        self.replicate(first, "first", second)
        self.replicate(second, "second", first)
        self.assertEqual(first.newest_local_write(), 3)
        self.assertEqual(second.newest_local_write(), 7)

    async def test_current_token_gap(self) -> None:
        """An idle writer jumps to the largest id seen; one with a write in
        flight does not."""
        writers = ["first", "second", "third"]
        first = self.make_id_gen("first", writers=writers)
        second = self.make_id_gen("second", writers=writers)
        self.make_id_gen("third", writers=writers)  # never writes
        for _ in range(7):
            await self.write_row_with(second, "second")
        self.replicate(second, "second", first)
        self.assertEqual(second.writer_position("second"), 7)
        self.assertEqual(second.persisted_upto_position(), 7)  # ids 1-7 all finished

        async with first.get_next_mult(2) as ids:
            self.assertEqual(ids, [8, 9])
        second.advance_writer("first", 9)
        self.assertEqual(second.writer_position("first"), 9)
        self.assertEqual(second.writer_position("second"), 9)

        async with first.get_next_mult(2) as ids:
            self.assertEqual(ids, [10, 11])
        async with second.get_next() as stream_id:
            self.assertEqual(stream_id, 12)
            second.advance_writer("first", 11)
            self.assertEqual(second.writer_position("first"), 11)
            # A write in flight at 12: second may not claim 11.
            self.assertEqual(second.writer_position("second"), 9)
        self.assertEqual(second.writer_position("second"), 12)
        # second never heard of 8 or 10 and third has announced nothing.
        self.assertEqual(second.persisted_upto_position(), 7)

    async def test_removed_writer_stops_holding_persisted_upto(self) -> None:
        """second wrote 3-5 and stopped for good; first goes on to 9. A reader
        still tracking second is stuck at 5 until second is removed."""
        self.insert_rows("first", 2)  # 1-2
        self.insert_rows("second", 3)  # 3-5
        writers = ["first", "second"]
        worker = self.make_id_gen("worker", writers=writers)
        first = self.make_id_gen("first", writers=writers)
        for _ in range(4):
            await self.write_row_with(first, "first")  # 6-9
        worker.advance_writer("first", 9)
        self.assertEqual(worker.persisted_upto_position(), 5)

        self.assertEqual(await worker.read_stopped_writer_position("second"), 5)
        worker.forget_writer("second")
        self.assertEqual(worker.known_writer_positions(), {"first": 9})
        self.assertEqual(worker.persisted_upto_position(), 9)
        self.assertEqual(worker.writer_position("second"), 9)
        worker.forget_writer("second")  # twice: nothing more to do

        # second comes back later and is tracked again.
        worker.advance_writer("second", 10)
        self.assertEqual(worker.known_writer_positions(), {"first": 9, "second": 10})
        with self.assertRaises(ValueError):
            first.forget_writer("first")

    async def test_stopped_writer_position_includes_unrecorded_rows(self) -> None:
        """second crashed after writing 4-5 but before recording them."""
        self.insert_rows("second", 3)  # 1-3, recorded
        self.insert_rows("second", 2, update_stream_table=False)  # 4-5
        self.insert_rows("first", 1)  # 6
        worker = self.make_id_gen("worker", writers=["first", "second"])
        self.assertEqual(await worker.read_stopped_writer_position("second"), 5)
        # A writer with no recorded position wrote nothing below persisted-up-to.
        self.assertEqual(
            await worker.read_stopped_writer_position("ghost"),
            worker.persisted_upto_position(),
        )

    async def test_ids_held_back_by_a_fetch_still_count_as_written_here(self) -> None:
        """A fetch under way (begun when the largest id seen was 0) may return
        any id above 0, so ids 1 and 2 finishing do not move our position; but
        they were written here, and the streamer must send their rows before
        announcing any position covering them."""
        id_gen = self.make_id_gen("first", writers=["first", "second"])
        with id_gen._lock:
            marker = id_gen._model.begin_fetch()
        self.assertEqual(marker, 0)
        try:
            for _ in range(2):
                await self.write_row_with(id_gen, "first")
            self.assertEqual(id_gen.known_writer_positions()["first"], 0)
            self.assertEqual(id_gen.newest_local_write(), 2)
        finally:
            with id_gen._lock:
                id_gen._model.end_fetch(marker)


class BackwardsTestCase(IdGeneratorTestCase):
    """A stream whose stored ids count down (backfill): the ids handed out and
    the rows and ``stream_positions`` hold -1, -2, ...; every position the
    generator reports counts up, like every other stream's."""

    positive = False

    async def test_single_instance(self) -> None:
        id_gen = self.make_id_gen()
        async with id_gen.get_next() as stream_id:
            self.assertEqual(stream_id, -1)
            await self.db.execute(
                "ins",
                "INSERT INTO foobar (stream_id, instance_name) VALUES (?, 'master')",
                stream_id,
            )
        self.assertEqual(id_gen.known_writer_positions(), {"master": 1})
        self.assertEqual(id_gen.writer_position("master"), 1)
        self.assertEqual(id_gen.persisted_upto_position(), 1)

        async with id_gen.get_next_mult(3) as ids:
            self.assertEqual(ids, [-2, -3, -4])
            for stream_id in ids:
                await self.db.execute(
                    "ins",
                    "INSERT INTO foobar (stream_id, instance_name) VALUES (?, 'master')",
                    stream_id,
                )
        self.assertEqual(id_gen.known_writer_positions(), {"master": 4})
        await id_gen.flush_stream_positions()
        self.assertEqual(await self.stored_positions(), {"master": -4})

        reloaded = self.make_id_gen()
        self.assertEqual(reloaded.known_writer_positions(), {"master": 4})
        self.assertEqual(reloaded.persisted_upto_position(), 4)

    async def test_multiple_instance(self) -> None:
        first = self.make_id_gen("first", writers=["first", "second"])
        second = self.make_id_gen("second", writers=["first", "second"])
        self.assertEqual(await self.write_row_with(first, "first"), -1)
        first_pos = first.writer_position("first")
        second.advance_writer("first", first_pos)
        self.assertEqual(first.known_writer_positions(), {"first": 1, "second": 0})
        self.assertEqual(second.known_writer_positions(), {"first": 1, "second": 0})
        self.assertEqual(second.writer_position("second"), 1)  # idle

        self.assertEqual(await self.write_row_with(second, "second"), -2)
        first.advance_writer("second", second.writer_position("second"))
        self.assertEqual(first.known_writer_positions(), {"first": 1, "second": 2})
        self.assertEqual(second.known_writer_positions(), {"first": 1, "second": 2})
        self.assertEqual(first.persisted_upto_position(), 2)
        self.assertEqual(second.persisted_upto_position(), 2)
        await first.flush_stream_positions()
        await second.flush_stream_positions()
        self.assertEqual(await self.stored_positions(), {"first": -1, "second": -2})

    def test_load_from_rows(self) -> None:
        self.insert_rows("master", 5, update_stream_table=False)
        worker = self.make_id_gen("worker", writers=["master"])
        self.assertEqual(worker.persisted_upto_position(), 5)

    async def test_stopped_writer_position(self) -> None:
        self.insert_rows("second", 2)  # -1, -2, recorded
        self.insert_rows("second", 1, update_stream_table=False)  # -3
        worker = self.make_id_gen("worker", writers=["second"])
        self.assertEqual(await worker.read_stopped_writer_position("second"), 3)


class MultiTableTestCase(IdGeneratorTestCase):
    tables = ("foobar1", "foobar2")

    def test_load_existing_stream(self) -> None:
        """A stream over two tables, with a row not yet in stream_positions."""
        self.insert_rows("first", 3, table="foobar1")  # 1-3
        self.insert_rows("second", 3, table="foobar2")  # 4-6, stored
        self.insert_rows("second", 1, table="foobar2", update_stream_table=False)  # 7
        worker = self.make_id_gen("worker", writers=["first", "second"])
        self.assertEqual(worker.known_writer_positions(), {"first": 3, "second": 6})
        # A writer restarting is at its sequence head (it has nothing in flight).
        second = self.make_id_gen("second", writers=["first", "second"])
        self.assertEqual(second.known_writer_positions(), {"first": 3, "second": 7})
        first = self.make_id_gen("first", writers=["first", "second"])
        self.assertEqual(first.known_writer_positions(), {"first": 7, "second": 7})
        for id_gen in (first, second, worker):
            self.assertEqual(id_gen.writer_position("first"), 7)
            self.assertEqual(id_gen.writer_position("second"), 7)
            self.assertEqual(id_gen.persisted_upto_position(), 7)

    async def test_one_sequence_across_tables(self) -> None:
        """Ids stay unique across the tables of one stream and a restart."""
        id_gen = self.make_id_gen()
        seen = []
        for table in ("foobar1", "foobar2", "foobar1"):
            async with id_gen.get_next() as stream_id:
                await self.db.execute(
                    "ins",
                    f"INSERT INTO {table} (stream_id, instance_name) VALUES (?, 'master')",
                    stream_id,
                )
                seen.append(stream_id)
        await id_gen.flush_stream_positions()
        restarted = self.make_id_gen()
        async with restarted.get_next() as stream_id:
            seen.append(stream_id)
        self.assertEqual(seen, [1, 2, 3, 4])
