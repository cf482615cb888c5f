"""Backfill's stored ids count down from -1; its positions count up, like every
other stream's. The flip is the stream's ``IdSpace``: what the writer hands
out and the database holds is negative, what replication, the stream view
and the catch-up query speak is positive."""

from __future__ import annotations

from twisted.trial import unittest

from synapse_lite.replication.tcp.commands import RdataCommand
from synapse_lite.storage.databases.main.events_worker import EventsWorkerStore
from synapse_lite.streams.catalog import BACKFILL, BackfillStreamRow
from synapse_lite.streams.definition import IdSpace, StreamTable
from tests.harness.client_api import start_cluster
from tests.harness.polling import eventually
from tests.harness.server import DatabaseTestCase

COUNTS_DOWN = IdSpace("s", (StreamTable("t"),), positive=False)
COUNTS_UP = IdSpace("s", (StreamTable("t"),))


class IdSpaceTestCase(unittest.TestCase):
    def test_stored_ids_and_positions(self) -> None:
        self.assertEqual([COUNTS_DOWN.stored_id(p) for p in (1, 2, 7)], [-1, -2, -7])
        self.assertEqual([COUNTS_DOWN.position(i) for i in (-1, -2, -7)], [1, 2, 7])
        self.assertEqual((COUNTS_UP.stored_id(7), COUNTS_UP.position(7)), (7, 7))

    def test_sql_selects_by_position(self) -> None:
        """Each condition, run on stored ids, keeps exactly the ids whose
        positions satisfy it, ordered by position."""
        import sqlite3

        db = sqlite3.connect(":memory:")
        db.execute("CREATE TABLE t (stream_id INTEGER)")
        for ids in (COUNTS_UP, COUNTS_DOWN):
            db.execute("DELETE FROM t")
            db.executemany("INSERT INTO t VALUES (?)", [(ids.stored_id(p),) for p in range(1, 8)])
            for comparison, keep in [
                ("<", lambda p: p < 4),
                ("<=", lambda p: p <= 4),
                (">", lambda p: p > 4),
                (">=", lambda p: p >= 4),
                ("=", lambda p: p == 4),
            ]:
                rows = db.execute(
                    f"SELECT {ids.position_sql('stream_id')} FROM t"
                    f" WHERE {ids.position_condition('stream_id', comparison)}"
                    f" ORDER BY {ids.position_order_sql('stream_id')}",
                    (ids.stored_id(4),),
                ).fetchall()
                self.assertEqual(
                    [r[0] for r in rows], [p for p in range(1, 8) if keep(p)], comparison
                )
            (newest,) = db.execute(
                f"SELECT {ids.newest_position_sql('stream_id')} FROM t"
            ).fetchone()
            self.assertEqual(newest, 7)


class BackfillAcrossProcessesTestCase(DatabaseTestCase):
    async def test_written_negative_replicated_positive(self) -> None:
        servers, _, bus = start_cluster(
            self, self.test_db, workers=["persister1"], stream_writers={"events": ["persister1"]}
        )
        main, p1 = servers["main"], servers["persister1"]
        await eventually(lambda: main.replication.connected and p1.replication.connected)

        generator = p1.id_generators.of(BACKFILL)
        for n in (1, 2):
            async with generator.get_next() as stored_id:
                self.assertEqual(stored_id, -n)
                await p1.store.db_pool.execute(
                    "insert_backfilled",
                    "INSERT INTO events (stream_ordering, topological_ordering, event_id,"
                    " room_id, type, sender, origin_server_ts, content, instance_name)"
                    " VALUES (?, 0, ?, '!room:test.local', 'm.room.message', '@a:other',"
                    " 1, '{}', 'persister1')",
                    stored_id,
                    f"$old{n}",
                )
        self.assertEqual(generator.writer_position("persister1"), 2)
        self.assertEqual(generator.persisted_upto_position(), 2)

        await main.waiters.wait_for_stream_position("persister1", "backfill", 2, timeout=5)
        followed = main.streams["backfill"].positions
        self.assertEqual(followed.received_position("persister1"), 2)
        self.assertEqual(followed.persisted_upto_position(), 2)
        sent = [
            (c.token, BACKFILL.parse_row(c.row).event_id)
            for _, c in bus.published
            if isinstance(c, RdataCommand) and c.stream_name == "backfill"
        ]
        self.assertEqual(sent, [(1, "$old1"), (2, "$old2")])

        # The catch-up query speaks positions too, in order.
        updates, upto, limited = await EventsWorkerStore.get_backfill_stream_updates(
            main.store, "persister1", 0, 2, 100
        )
        self.assertEqual(
            [(token, row.event_id) for token, row in updates], [(1, "$old1"), (2, "$old2")]
        )
        self.assertIsInstance(updates[0][1], BackfillStreamRow)
        self.assertEqual((upto, limited), (2, False))
        updates, _, _ = await EventsWorkerStore.get_backfill_stream_updates(
            main.store, "persister1", 1, 2, 100
        )
        self.assertEqual([token for token, _ in updates], [2])

        # The database holds stored ids; a reader loading afresh gets positions.
        await generator.flush_stream_positions()
        [(stored,)] = await p1.store.db_pool.execute(
            "stored_backfill_position",
            "SELECT stream_id FROM stream_positions"
            " WHERE stream_name = 'backfill' AND instance_name = 'persister1'",
        )
        self.assertEqual(stored, -2)
        self.assertEqual(await followed.read_stopped_writer_position("persister1"), 2)
        self.assertEqual(await followed.read_max_allocated(), 2)
