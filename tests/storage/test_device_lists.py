"""The device_lists stream's update function: rows of both its tables, in id
order, and never a page that splits the rows of one id."""

from __future__ import annotations

from synapse_lite.storage.database import LoggingTransaction
from tests.harness.server import DatabaseTestCase, make_config, make_homeserver


class DeviceListsUpdatesTestCase(DatabaseTestCase):
    async def test_pages_cover_both_tables_without_splitting_an_id(self) -> None:
        hs = make_homeserver(self, make_config(self.test_db))
        store = hs.store
        key = {"user_id": "@a:test.local", "usage": ["master"], "keys": {"ed25519:K": "K"}}
        ids: list[int] = []

        async def change(devices: list[str]) -> int:
            def txn_func(txn: LoggingTransaction) -> int:
                return store.add_device_changes_txn(txn, "@a:test.local", devices)

            return await store.db_pool.runInteraction("change", txn_func)

        ids.append(await change(["D1"]))
        ids.append(await change(["D2", "D3", "D4"]))
        cross = {"master": key, "self_signing": {**key, "usage": ["self_signing"]}}
        ids.append(await store.set_cross_signing_keys("@a:test.local", cross))
        ids.append(await change(["D5"]))
        current = ids[-1]

        seen: list[tuple[int, str]] = []
        position, pages = 0, 0
        while position < current:
            rows, upto, limited = await store.get_all_device_list_changes(
                "main", position, current, 2
            )
            pages += 1
            for stream_id, _ in rows:
                self.assertGreater(stream_id, position)
                self.assertLessEqual(stream_id, upto)
            self.assertEqual(limited, upto < current)
            seen += [(stream_id, row.device_id) for stream_id, row in rows]
            # No id's rows are split: every row of the page's last id is in it.
            if rows:
                last = rows[-1][0]
                self.assertEqual(
                    sum(1 for s, _ in seen if s == last),
                    {ids[0]: 1, ids[1]: 3, ids[2]: 2, ids[3]: 1}[last],
                )
            position = upto
            self.assertLess(pages, 10)
        self.assertEqual(
            sorted(seen),
            sorted(
                [(ids[0], "D1")]
                + [(ids[1], d) for d in ("D2", "D3", "D4")]
                + [(ids[2], "master"), (ids[2], "self_signing")]
                + [(ids[3], "D5")]
            ),
        )
        changed = await store.get_users_whose_devices_changed(ids[1], ids[2], "@b:test.local")
        self.assertEqual(changed, {"@a:test.local"})
