"""The sliding sync connection rows (``sliding_sync_positions``): a
connection keeps the pos its client used and the one handed out after it,
starting over drops its rows, a device's connections are bounded, old ones
expire (SQLite and PostgreSQL)."""

from __future__ import annotations

from synapse_lite.storage.databases.main.sliding_sync import MAX_CONNECTIONS_PER_DEVICE
from tests.harness.server import DatabaseTestCase, make_config, make_homeserver

BOB = "@bob:test.local"


class SlidingSyncPositionsTestCase(DatabaseTestCase):
    async def positions(self, store: object) -> list[str]:
        rows = await store.db_pool.select(  # type: ignore[attr-defined]
            "t", "SELECT pos FROM sliding_sync_positions ORDER BY created_ts, pos"
        )
        return [r[0] for r in rows]

    async def test_a_connection_keeps_the_used_and_the_new_pos(self) -> None:
        store = make_homeserver(self, make_config(self.test_db)).store
        save = store.save_sliding_sync_position
        await save("p1", BOB, "DEV", "main", "s1", "{}", 1, None)
        await save("p2", BOB, "DEV", "main", "s2", "{}", 2, "p1")
        self.assertEqual(await self.positions(store), ["p1", "p2"])
        # A retry with p1 replaces p2 (never used); using p3 drops p1.
        await save("p3", BOB, "DEV", "main", "s3", "{}", 3, "p1")
        self.assertEqual(await self.positions(store), ["p1", "p3"])
        await save("p4", BOB, "DEV", "main", "s4", "{}", 4, "p3")
        self.assertEqual(await self.positions(store), ["p3", "p4"])
        saved = await store.get_sliding_sync_position("p4")
        assert saved is not None
        self.assertEqual(
            (saved.user_id, saved.device_id, saved.conn_id, saved.stream_token, saved.created_ts),
            (BOB, "DEV", "main", "s4", 4),
        )
        self.assertIsNone(await store.get_sliding_sync_position("p1"))
        # Another connection of the device is left alone; starting over
        # drops the connection's rows.
        await save("e1", BOB, "DEV", "encryption", "s4", "{}", 5, None)
        await save("p5", BOB, "DEV", "main", "s5", "{}", 6, None)
        self.assertEqual(await self.positions(store), ["e1", "p5"])

    async def test_connections_per_device_are_bounded_and_expire(self) -> None:
        store = make_homeserver(self, make_config(self.test_db)).store
        for i in range(MAX_CONNECTIONS_PER_DEVICE + 2):
            await store.save_sliding_sync_position(
                f"c{i}", BOB, "DEV", f"conn{i}", "s", "{}", 100 + i, None
            )
        kept = await self.positions(store)
        self.assertEqual(len(kept), MAX_CONNECTIONS_PER_DEVICE)
        self.assertNotIn("c0", kept)
        self.assertIn(f"c{MAX_CONNECTIONS_PER_DEVICE + 1}", kept)
        # A new connection expires the user's connections unused too long.
        last = 100 + MAX_CONNECTIONS_PER_DEVICE + 1
        await store.save_sliding_sync_position(
            "new", BOB, "DEV", "new", "s", "{}", 500, None, expire_before_ms=last
        )
        self.assertEqual(await self.positions(store), [f"c{MAX_CONNECTIONS_PER_DEVICE + 1}", "new"])
