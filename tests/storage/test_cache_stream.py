"""The caches stream's update function follows the position rule of every
stream (issue 22, item 11): rows above the writer's position are not sent.

The Spark audit found ``position_before_finish`` on the caches stream: rows
were sent, and each logged as a position, past the writer's position. On
PostgreSQL one process's transactions may commit out of order, so a lower id
could still be in flight and a follower would skip that invalidation.
"""

from __future__ import annotations

from twisted.internet import reactor
from twisted.trial import unittest

from synapse_lite.storage.database import DatabasePool, make_startup_connection
from synapse_lite.storage.databases.main.cache import CacheInvalidationWorkerStore
from synapse_lite.storage.prepare_database import prepare_database
from tests.harness.databases import create_test_database


class CachesUpdateFunctionTestCase(unittest.TestCase):
    def setUp(self) -> None:
        test_db = create_test_database()
        self.addCleanup(test_db.drop)
        engine = test_db.make_engine()
        conn = make_startup_connection(engine)
        try:
            prepare_database(conn, is_main=True)
            with conn.transaction("seed") as txn:
                # worker1 committed 1, 2, 3 and 5; 4 is still in flight.
                for stream_id in (1, 2, 3, 5):
                    txn.execute(
                        "INSERT INTO cache_invalidation_stream_by_instance"
                        " (stream_id, instance_name, cache_func, keys, invalidation_ts)"
                        " VALUES (?, 'worker1', 'get_user', ?, 0)",
                        (stream_id, f'["@u{stream_id}:test"]'),
                    )
        finally:
            conn.close()
        self.pool = DatabasePool(reactor, engine, max_connections=1)
        self.addCleanup(self.pool.close)
        # Only the update function is under test: it needs nothing but the pool.
        self.store = CacheInvalidationWorkerStore.__new__(CacheInvalidationWorkerStore)
        self.store.db_pool = self.pool

    async def test_rows_above_the_position_wait(self) -> None:
        updates, token, limited = await self.store.get_all_updated_caches("worker1", 0, 3, 100)
        self.assertEqual([stream_id for stream_id, _ in updates], [1, 2, 3])
        self.assertEqual((token, limited), (3, False))
        self.assertEqual(updates[0][1].keys, ["@u1:test"])

        # Once 4 finished, the position moves to 5 and 5 goes out.
        updates, token, limited = await self.store.get_all_updated_caches("worker1", 3, 5, 100)
        self.assertEqual([stream_id for stream_id, _ in updates], [5])
        self.assertEqual((token, limited), (5, False))

    async def test_a_full_page_reaches_its_last_row(self) -> None:
        updates, token, limited = await self.store.get_all_updated_caches("worker1", 0, 5, 2)
        self.assertEqual([stream_id for stream_id, _ in updates], [1, 2])
        self.assertEqual((token, limited), (2, True))
