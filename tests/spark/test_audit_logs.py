"""The audit against the position logs of a real multi-writer run.

Two processes (``main`` and ``worker1``) write the events stream with real
MultiWriterIdGenerators, out of order, each with its own PositionLog in the
data directory. After every finish each process hands out its positions the
way a server hands out /sync tokens. A run where every position waits for the
ids below it is clean; a position handed out before an id below it finished
(the race that loses events from /sync) is caught with the rows it skipped.
"""

from __future__ import annotations

import time
from typing import Any

from twisted.internet import reactor
from twisted.trial import unittest

from synapse_lite.position_log import STREAM_WIDE, PositionLog, position_log_path
from synapse_lite.replication.notifier import ReplicationNotifier
from synapse_lite.storage.database import DatabasePool, LoggingTransaction, make_startup_connection
from synapse_lite.storage.id_generators import MultiWriterIdGenerator
from synapse_lite.storage.id_generators import generator as id_generators
from synapse_lite.streams.catalog import EVENTS
from tests.spark.fixture import EXTREMITY_SQL, AuditFixture, _columns

assert EVENTS.ids is not None
EVENTS_IDS = EVENTS.ids
WRITERS = ["main", "worker1"]


class Process:
    """One server process writing the events stream."""

    def __init__(self, test: unittest.TestCase, hs: AuditFixture, name: str) -> None:
        self.name = name
        self.db = DatabasePool(reactor, hs.engine, max_connections=1)
        test.addCleanup(self.db.close)
        self.log = PositionLog(position_log_path(hs.data_dir, name), name)
        test.addCleanup(self.log.close)
        conn = make_startup_connection(hs.engine)
        try:
            self.id_gen = MultiWriterIdGenerator(
                db_conn=conn,
                db=self.db,
                notifier=ReplicationNotifier(),
                stream_name=EVENTS.name,
                instance_name=name,
                ids=EVENTS_IDS,
                writers=WRITERS,
                position_log=self.log,
            )
        finally:
            conn.close()

    async def write(self, stream_id: int) -> None:
        row = _columns("events", self.name, stream_id)
        await self.db.execute(
            "insert_event",
            f"INSERT INTO events ({', '.join(row)}) VALUES ({', '.join('?' for _ in row)})",
            *row.values(),
        )
        await self.db.execute("insert_extremity", EXTREMITY_SQL, row["room_id"], row["event_id"])

    async def fail_one(self) -> None:
        """A transaction that takes an id and rolls back: a gap."""

        def failing(txn: LoggingTransaction) -> None:
            self.id_gen.get_next_txn(txn)
            raise ValueError("constraint violated")

        try:
            await self.db.runInteraction("failing", failing)
        except ValueError:
            pass

    def hand_out(self) -> None:
        """What a /sync response carries: every writer's position and the
        stream-wide one."""
        for writer in WRITERS:
            position = self.id_gen.writer_position(writer)
            self.log.position("events", writer, position, "sync")
        self.log.position("events", STREAM_WIDE, self.id_gen.persisted_upto_position(), "sync")

    def receive(self, other: Process) -> None:
        """RDATA/POSITION from ``other``."""
        self.id_gen.advance_writer(other.name, other.id_gen.writer_position(other.name))


class AuditLogsTestCase(unittest.TestCase):
    def setUp(self) -> None:
        self.patch(id_generators, "STREAM_POSITIONS_WRITE_DELAY", 0)
        self.hs = AuditFixture(self, event_graph=False)
        self.hs.write("events", "main", [1, 2])  # before logging began
        self.hs.position("events", "main", 2)
        self.main = Process(self, self.hs, "main")
        self.worker = Process(self, self.hs, "worker1")
        self.processes = [self.main, self.worker]

    def everyone_hands_out(self) -> None:
        for process in self.processes:
            process.hand_out()

    async def finish(self, block: Any, process: Process) -> None:
        await block.__aexit__(None, None, None)
        for other in self.processes:
            if other is not process:
                other.receive(process)
        self.everyone_hands_out()

    async def run_out_of_order(self, race: bool) -> None:
        """main takes 3 and 5, worker1 takes 4; they finish 4, 5, 3.

        With ``race``, worker1 hands out stream-wide position 5 and main its
        own position 5 while 3 is still in flight."""
        blocks = [
            (self.main, self.main.id_gen.get_next()),
            (self.worker, self.worker.id_gen.get_next()),
            (self.main, self.main.id_gen.get_next()),
        ]
        ids = [await block.__aenter__() for _, block in blocks]
        self.assertEqual(ids, [3, 4, 5])
        for (process, _), stream_id in zip(blocks, ids, strict=True):
            await process.write(stream_id)
        self.everyone_hands_out()
        for index in (1, 2):  # 4 then 5 finish; 3 is still in flight
            await self.finish(blocks[index][1], blocks[index][0])
        self.assertEqual(self.main.id_gen.persisted_upto_position(), 2)
        if race:
            self.worker.log.position("events", STREAM_WIDE, 5, "sync")
            self.main.log.position("events", "main", 5, "rdata")
            time.sleep(0.005)  # the late finish must be logged in a later millisecond
        await self.finish(blocks[0][1], blocks[0][0])
        await self.worker.fail_one()  # 6: a gap
        async with self.worker.id_gen.get_next() as stream_id:
            await self.worker.write(stream_id)
        self.assertEqual(stream_id, 7)
        self.main.receive(self.worker)
        self.everyone_hands_out()
        for process in self.processes:
            await process.id_gen.flush_stream_positions()
            process.log.close()

    async def test_clean_run_reports_nothing(self) -> None:
        await self.run_out_of_order(race=False)
        run = self.hs.audit()  # the logs are found in the data_dir
        self.assertEqual(run.code, 0, run)
        self.assertEqual(run.findings(), [])
        self.assertEqual(len(run.report["position_logs"]["files"]), 2)
        self.assertGreater(run.report["position_logs"]["records"], 20)
        (gap,) = run.info()
        self.assertEqual((gap["kind"], gap["stream"], gap["ids"]), ("gap", "events", [6]))
        self.assertEqual(gap["details"]["logged_failed"], 1)
        events = run.stream("events")
        self.assertEqual(events["persisted_upto"], self.main.id_gen.persisted_upto_position())
        self.assertEqual(events["persisted_upto"], 7)

    async def test_position_before_finish_is_caught(self) -> None:
        await self.run_out_of_order(race=True)
        with open(position_log_path(self.hs.data_dir, "worker1"), "a") as f:
            f.write('{"kind": "position", "ts": 12\n')  # a torn line: reported, not fatal
        run = self.hs.audit()
        self.assertEqual(run.code, 1, run)
        found = {
            (f["details"]["process"], f["details"]["position_writer"]): f
            for f in run.findings("position_before_finish")
        }
        self.assertEqual(set(found), {("worker1", "*"), ("main", "main")})
        self.assertEqual(len(run.findings()), 2)
        for finding in found.values():
            self.assertEqual(
                (finding["stream"], finding["writer"], finding["ids"]), ("events", "main", [3])
            )
            (sample,) = finding["samples"]
            self.assertEqual(sample["position"], 5)
            self.assertEqual(sample["tables"], ["events"])  # the row /sync would have skipped
            self.assertGreater(sample["finished_ts"], sample["position_ts"])
        self.assertEqual(found[("main", "main")]["samples"][0]["purpose"], "rdata")
        (malformed,) = run.info("malformed_log_lines")
        self.assertEqual(malformed["count"], 1)
